"""``Runtime.call``: the one path every caller takes through the Manager to a backend
(admit, call the dispatched replica with its lease, relay a stream, release, peak,
metrics, one refusal type), and ``Runtime.load`` (a load with nothing to run)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.live.support import base_config, fake, live, run

from accelmux.backends.base import BackendResponse
from accelmux.core.events import Demand
from accelmux.core.types import Reason, ServiceKind, ServiceStatus
from accelmux.runtime.call import Call
from accelmux.runtime.requests import Refused

SRC = Path(__file__).resolve().parents[2] / "src" / "accelmux"


class ListSink:
    """A stream's chunks, as a caller's sink receives them."""

    def __init__(self) -> None:
        self.opened: list[int] = []
        self.chunks: list[bytes] = []

    @property
    def started(self) -> bool:
        return bool(self.opened)

    async def open(self, answer: BackendResponse) -> None:
        self.opened.append(answer.status)

    async def write(self, chunk: bytes) -> None:
        self.chunks.append(chunk)


def config() -> dict[str, object]:
    return base_config(
        chat={"kind": "chat", "memory": {"weights": "64MiB"}, "backend": fake()},
        embed={
            "kind": "embeddings",
            "memory": {"weights": "64MiB", "per_unit": "1MiB"},
            "backend": fake(embedding_dim=4),
        },
    )


def test_a_call_runs_on_the_dispatched_replica_and_counts_its_latency(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(config(), tmp=tmp_path) as lv:
            rt = lv.runtime
            call = Call(
                kind=ServiceKind.EMBEDDINGS,
                endpoint="/v1/embeddings",
                body={"model": "embed", "input": ["a", "b"]},
            )
            answer = await rt.call("embed", Demand(units=2.0), call)
            assert answer.status == 200 and b"embedding" in answer.body
            assert rt.service_state("embed").served == 1
            samples = rt.metrics.latency.labels("embed", "/v1/embeddings", "ok")
            assert samples._sum.get() > 0  # counted once, by the call

    run(body())


def test_a_streamed_answer_goes_to_the_sink(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(config(), tmp=tmp_path) as lv:
            call = Call(
                kind=ServiceKind.CHAT,
                endpoint="/v1/chat/completions",
                body={"model": "chat", "messages": [{"role": "user", "content": "hi"}]},
                stream=True,
            )
            sink = ListSink()
            await lv.runtime.call("chat", Demand(kv_tokens=16), call, sink=sink)
            assert sink.opened == [200]
            assert any(b"data:" in c for c in sink.chunks)

    run(body())


def test_a_refusal_is_one_type_and_a_load_runs_nothing(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(config(), tmp=tmp_path) as lv:
            rt = lv.runtime
            await rt.load("chat")
            assert rt.service_state("chat").status is ServiceStatus.LOADED
            assert rt.service_state("chat").served == 1  # the load's empty request
            call = Call(kind=ServiceKind.EMBEDDINGS, endpoint="/v1/embeddings")
            with pytest.raises(Refused) as err:
                await rt.call("embed", Demand(units=1e6), call)  # can never fit
            assert err.value.reason is Reason.TOO_LARGE

    run(body())


def test_the_shell_reads_the_world_only_through_the_view() -> None:
    """No module outside the core and the simulator reaches into ``manager.world``: the
    shell reads ``Manager.view`` (a read-only WorldView) or the Runtime's reads."""
    found = [
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if path.parts[len(SRC.parts)] not in ("core", "sim")
        and "manager.world" in path.read_text(encoding="utf-8")
    ]
    assert found == []
