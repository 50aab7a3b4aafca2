"""One call of a service through the Manager: what the caller asks (:class:`Call`) and
where a streamed answer goes (:class:`Sink`); :meth:`Runtime.call
<accelmux.runtime.daemon.Runtime.call>` does the rest.

Every caller (the OpenAI and Ollama APIs, Wyoming, the jobs, the cameras, the replay)
used to write the same closure: admit the request, call the backend of the replica the
Manager dispatched it to with the lease it granted, relay a stream, release what the
answer holds, report its peak, count its latency, and map the Manager's refusal. It is
written once, here and in ``Runtime.call``; a caller says what to send and, for a
stream, where its bytes go.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Protocol

from accelmux.backends.base import BackendRequest, BackendResponse
from accelmux.core.actions import Dispatch
from accelmux.core.types import ServiceKind
from accelmux.errors import BackendError
from accelmux.runtime.live_latency import LiveLatency


@dataclass(frozen=True, slots=True, kw_only=True)
class Call:
    """What a caller sends a service's backend, but the replica and the memory: the
    Manager's dispatch decides those (:meth:`request`)."""

    kind: ServiceKind
    endpoint: str
    body: dict[str, Any] = field(default_factory=dict)
    stream: bool = False
    files: dict[str, bytes] = field(default_factory=dict)
    file_info: dict[str, tuple[str, str]] = field(default_factory=dict)
    raw: bytes = b""
    content_type: str = "application/json"

    def request(self, request_id: str, service: str, lease_bytes: int) -> BackendRequest:
        """The backend request for the replica ``service`` with ``lease_bytes`` granted."""
        return BackendRequest(
            request_id=request_id,
            service=service,
            kind=self.kind,
            endpoint=self.endpoint,
            body=self.body,
            stream=self.stream,
            files=self.files,
            file_info=self.file_info,
            raw=self.raw,
            content_type=self.content_type,
            lease_bytes=lease_bytes,
        )

    def dispatched(self, request_id: str, dispatch: Dispatch) -> BackendRequest:
        """:meth:`request` for the replica and lease of ``dispatch``."""
        return self.request(request_id, dispatch.service, dispatch.lease_bytes)


class Sink(Protocol):
    """Where a streamed answer goes: opened once (its first answer), then written chunk by
    chunk. ``started``: part of an answer went out, so a rerun (the request preempted and
    dispatched again) would repeat it: the call fails instead."""

    @property
    def started(self) -> bool: ...

    async def open(self, answer: BackendResponse) -> None: ...

    async def write(self, chunk: bytes) -> None: ...


async def relay_stream(
    answer: BackendResponse, sink: Sink, live: LiveLatency, service: str, arrived: float
) -> None:
    """Relay ``answer``'s stream into ``sink``, timing its chunks (the live latency of
    ``service``, the request having arrived at ``arrived``); the stream is closed and
    what the answer holds released whatever happens."""
    chunks = answer.stream
    if chunks is None:
        return
    timer = live.stream(service, arrived)
    try:
        await sink.open(answer)
        async for chunk in chunks:
            if chunk:
                timer.chunk(chunk)
            await sink.write(chunk)
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
        if answer.release is not None:
            answer.release()


def rerun_guard(sink: Sink | None) -> None:
    """Refuse to run a request again once part of its answer went out."""
    if sink is not None and sink.started:
        raise BackendError("stream preempted for higher-class work after partial output")
