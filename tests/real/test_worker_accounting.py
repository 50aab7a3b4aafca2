"""The real inference worker and the ledger: two services of the shared worker that name
the same model load one copy, charged once (the second names the first); a resize the
worker did not apply (a model whose context it cannot change) reaches the Manager as a
refusal."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from tests.live.support import base_config, live, run

from accelmux.backends.worker import WorkerPool
from accelmux.config.backends import WorkerBackendConfig
from accelmux.core.types import Category, ServiceKind
from accelmux.errors import BackendError

from .support import MINILM, MINILM_TOKENIZER, ORT, TOKENIZERS, need

pytestmark = pytest.mark.real
MINILM_ALL = (ORT, TOKENIZERS, MINILM, MINILM_TOKENIZER)


def _embeddings(**extra: Any) -> dict[str, Any]:
    return {
        "kind": "embeddings",
        "memory": {"weights": "160MiB", "runtime": "8MiB", "workspace": "64MiB"},
        "backend": {"type": "worker"},
        **extra,
    }


def test_two_services_of_one_model_are_charged_one_copy(tmp_path: Path) -> None:
    need(*MINILM_ALL)
    config = base_config(embeddings=_embeddings(), indexer=_embeddings(**{"class": "batch"}))

    async def body() -> None:
        async with live(config, tmp=tmp_path) as lv, lv.openai(timeout=120) as client:
            for name in ("embeddings", "indexer"):
                answer = await client.embeddings.create(model=name, input=["a cat", "a dog"])
                assert len(answer.data) == 2
            world = lv.runtime.manager.world
            ledger = world.ledger
            dev = world.services["embeddings"].spec.device
            charged = {
                n: ledger.amount(dev, n, Category.WEIGHTS) for n in ("embeddings", "indexer")
            }
            status, body = await lv.get("/admin/status")
            assert status == 200
        services = {s["name"]: s for s in body["services"]}
        assert charged["embeddings"] > 0 and charged["indexer"] == 0
        assert services["indexer"]["weights_shared_by"] == "embeddings"
        assert services["embeddings"]["weights_shared_with"] == ["indexer"]
        assert services["indexer"]["backend"]["last_load"]["shared"] is True  # the worker's word
        assert ledger.decided(dev) >= charged["embeddings"]

    run(body())


def test_a_resize_the_worker_does_not_apply_is_a_refusal(tmp_path: Path) -> None:
    need(*MINILM_ALL)

    async def body() -> None:
        pool = WorkerPool(tmp_path)
        backend = pool.backend(
            "embeddings", ServiceKind.EMBEDDINGS, WorkerBackendConfig(type="worker")
        )
        try:
            await backend.load(weights_bytes=0, runtime_bytes=0, kv_pool_bytes=0)
            with pytest.raises(BackendError, match="did not resize the KV pool"):
                await backend.resize(64 << 20)
        finally:
            await backend.unload()
            await backend.close()

    asyncio.run(asyncio.wait_for(body(), 120))
