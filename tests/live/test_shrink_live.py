"""Batch shrinking on the live daemon (the fake NVML: there is no GPU here, and a fake
runtime): a game takes most of the GPU, the jobs runner's embeddings batches run at a
smaller batch and fewer at once (batch_shrunk), and at the full batch again when the game
leaves (batch_grown); each change is in the decision log and /admin/explain."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from tests.live.support import fake, live, run, settle
from tests.live.test_degrade_live import GIB, _nvml, game  # noqa: F401 (a fixture)

from accelmux.jobs import JobRunner, JobStore
from accelmux.monitors import nvidia
from accelmux.server.wiring import batch_of, submit_embeddings

BATCH = 32


def _config() -> dict[str, Any]:
    return {
        "devices": {
            "gpu": {"kind": "nvidia", "index": 0, "capacity": "8GiB", "headroom": "256MiB"},
        },
        "services": {
            "indexer": {
                "kind": "embeddings",
                "class": "batch",
                "device": "gpu",
                "concurrency": 2,
                "memory": {"weights": "1GiB", "workspace": "64MiB", "per_unit": "64MiB"},
                "shrink": {"min_batch_fraction": 0.125},
                "backend": fake(),
            }
        },
        "policy": {"prewarm": False},
        "server": {"drain_s": 2.0},
    }


def test_jobs_run_smaller_batches_beside_a_game_and_grow_back(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    game: subprocess.Popen[bytes],  # noqa: F811
) -> None:
    held = {"bytes": 0, "ours": 0}
    monkeypatch.setattr(nvidia, "pynvml", _nvml(game.pid, held))

    async def body() -> tuple[list[dict[str, Any]], list[int], list[int], dict[str, Any]]:
        async with live(_config(), tmp=tmp_path, sample=True) as lv:
            rt = lv.runtime
            store = JobStore.open(tmp_path / "jobs")
            sizes: list[int] = []

            async def submit(model: str, texts: list[str]) -> Any:
                sizes.append(len(texts))
                return await submit_embeddings(rt, model, texts)

            runner = JobRunner(store, submit, batch_of=lambda model: batch_of(rt, model))

            async def sample() -> None:
                view = rt.manager.view
                held["ours"] = sum(
                    s.resident_bytes for s in view.services.values() if s.status.value == "loaded"
                )
                await rt.sample_once()

            # a game holds 5 GiB: a full batch (32 x 64 MiB of activations) cannot fit
            held["bytes"] = 5 * GIB
            await sample()
            store.create_job("indexer", [f"doc {i}" for i in range(4 * BATCH)])
            await runner.run_until_idle()
            shrunk = list(sizes)
            # the game ends: room returns, the next batches run full again
            held["bytes"] = 0
            for _ in range(3):
                await sample()
            await settle(lambda: rt.manager.view.ledger.available("gpu") > 6 * GIB)
            sizes.clear()
            store.create_job("indexer", [f"doc {i}" for i in range(4 * BATCH)])
            await runner.run_until_idle()
            explain = (await lv.get("/admin/explain"))[1]
            store.close()
            return list(rt.manager.snapshot().decisions), shrunk, list(sizes), explain

    decisions, shrunk, grown, explain = run(body())
    rebatches = [d for d in decisions if d["action"] == "rebatch"]
    reasons = [d["reason"] for d in rebatches]
    assert reasons[0] == "batch_shrunk", rebatches
    assert "batch_grown" in reasons, rebatches
    assert "MiB at the full batch" in rebatches[0]["detail"]
    # the runner claimed smaller batches once the Manager shrank the service, and full
    # ones after it grew back
    assert min(shrunk) < BATCH, shrunk
    assert grown[-1] == BATCH, grown
    indexer = explain["devices"]["gpu"]["services"]["indexer"]
    assert indexer["batch"]["reason"] == "batch_grown" and indexer["batch"]["fraction"] == 1.0
