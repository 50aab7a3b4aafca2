"""What backends tell the Manager for its accounting: which requests can pause, a worker's
resize it did not apply, the context placeholders of an external server, and which
worker services share one copy of their weights."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from accelmux.backends.base import BackendRequest, can_pause
from accelmux.backends.worker import WorkerBackend, WorkerPool
from accelmux.config.backends import ExternalBackendConfig, WorkerBackendConfig
from accelmux.config.load import load_config_data
from accelmux.config.specs import to_manager_spec
from accelmux.core.types import ServiceKind
from accelmux.errors import BackendError

from .support import base_config


def chat_request(**body: Any) -> BackendRequest:
    return BackendRequest(
        request_id="r1",
        service="chat",
        kind=ServiceKind.CHAT,
        endpoint="/v1/chat/completions",
        body={"messages": [{"role": "user", "content": "hi"}], **body},
        stream=True,
    )


class StubClient:
    """The few WorkerClient members a WorkerBackend uses here; ``reply`` answers calls."""

    def __init__(self, reply: dict[str, Any]) -> None:
        self.reply = reply
        self.alive = True
        self.memory: dict[str, Any] = {}
        self.calls: list[dict[str, Any]] = []

    def add_death_listener(self, listener: Any) -> None:
        pass

    async def call(self, header: dict[str, Any], *args: Any, **kw: Any) -> tuple[Any, bytes]:
        self.calls.append(header)
        return self.reply, b""


def worker_backend(tmp_path: Path, reply: dict[str, Any]) -> WorkerBackend:
    pool = WorkerPool(tmp_path)
    cfg = WorkerBackendConfig(type="worker")
    backend = WorkerBackend("chat", ServiceKind.CHAT, cfg, StubClient(reply), pool)  # type: ignore[arg-type]
    backend.loaded = True
    return backend


def test_a_resize_the_worker_did_not_apply_is_a_refusal(tmp_path: Path) -> None:
    backend = worker_backend(tmp_path, {"applied": False, "kv_bytes": 1234})
    with pytest.raises(BackendError, match="did not resize the KV pool to 4096 B"):
        asyncio.run(backend.resize(4096))
    applied = worker_backend(tmp_path, {"applied": True, "kv_bytes": 4096})
    asyncio.run(applied.resize(4096))  # no error


def test_a_worker_llm_can_pause_its_streamed_generations(tmp_path: Path) -> None:
    backend = worker_backend(tmp_path, {})
    assert can_pause(backend, chat_request())  # type: ignore[arg-type]
    unstreamed = BackendRequest(
        request_id="r2",
        service="chat",
        kind=ServiceKind.CHAT,
        endpoint="/v1/chat/completions",
        body={"messages": []},
    )
    assert not can_pause(backend, unstreamed)  # type: ignore[arg-type]


def test_llama_server_cannot_pause_tools_structured_output_logprobs_or_n() -> None:
    from accelmux.backends.external import ExternalBackend

    cfg = ExternalBackendConfig(
        type="external",
        argv=["llama-server", "--slot-save-path", "{slot_save_path}", "--port", "{port}"],
        park="llama-server",
    )

    class Probe:
        parking = object()  # it parks

    probe = Probe()
    decide = ExternalBackend.can_pause
    assert decide(probe, chat_request())  # type: ignore[arg-type]
    assert not decide(probe, chat_request(tools=[{"type": "function"}]))  # type: ignore[arg-type]
    assert not decide(probe, chat_request(response_format={"type": "json_object"}))  # type: ignore[arg-type]
    assert not decide(probe, chat_request(logprobs=True))  # type: ignore[arg-type]
    assert not decide(probe, chat_request(n=2))  # type: ignore[arg-type]
    probe.parking = None  # type: ignore[assignment]
    assert not decide(probe, chat_request())  # type: ignore[arg-type]
    caps = cfg.capabilities(ServiceKind.CHAT)
    assert caps.pause and caps.park_on_disk  # slot files are not host RAM


def test_a_server_started_with_parallel_slots_admits_against_one_slot() -> None:
    split = ExternalBackendConfig(
        type="external",
        argv=["llama-server", "-c", "{ctx_total}", "--parallel", "{parallel}"],
    )
    assert split.capabilities(ServiceKind.CHAT).kv_per_slot
    whole = ExternalBackendConfig(type="external", argv=["llama-server", "-c", "{ctx_size}"])
    assert not whole.capabilities(ServiceKind.CHAT).kv_per_slot


def test_ctx_placeholders_give_the_whole_pool_and_one_slot(tmp_path: Path) -> None:
    from accelmux.backends.external import ExternalBackend

    cfg = ExternalBackendConfig(
        type="external",
        argv=["srv", "-c", "{ctx_total}", "--parallel", "{parallel}", "--per", "{ctx_per_slot}"],
    )
    backend = ExternalBackend(
        "chat", "m", cfg, concurrency=4, kv_bytes_per_token=1024, data_dir=tmp_path
    )
    backend.kv_pool_bytes = 8192 * 1024
    values = backend._values(8080)
    assert values["ctx_total"] == values["ctx_size"] == 8192
    assert values["ctx_per_slot"] == 2048
    assert values["parallel"] == 4


def test_worker_services_of_one_model_share_one_weights_copy() -> None:
    def svc(kind: str, **backend: Any) -> dict[str, Any]:
        return {
            "kind": kind,
            "memory": {"weights": "64MiB"},
            "backend": {"type": "worker", **backend},
        }

    data = base_config(
        embeddings=svc("embeddings"),
        indexer=svc("embeddings"),  # the default stack's pair: one MiniLM copy
        own=svc("embeddings", isolated=True),
        chat=svc("chat"),
        completion=svc("completion"),
    )
    spec = to_manager_spec(load_config_data(data, "test"))
    keys = {s.name: s.weights_key for s in spec.services}
    assert keys["indexer"] == keys["embeddings"] == "minilm:packaged@gpu"
    assert keys["own"] == ""  # a worker of its own shares nothing
    assert keys["chat"] != keys["completion"]
