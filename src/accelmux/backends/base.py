"""The one Backend Protocol, and the request/response types it speaks.

The runtime calls a backend only when the Manager told it to: ``load`` after a Load
action, ``unload`` after an Unload, ``resize`` after a Resize, ``handle`` after a
Dispatch, ``pause`` and ``resume`` after a Pause and a Resume. A backend never decides
anything; it reports facts back (load sizes, the peak memory of a request, whether a
resize took, a crash through the ``on_crash`` callback) and declares what it can do
(:class:`~accelmux.core.specs.Capabilities`): the Manager is built from those
declarations and asks for nothing else."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from accelmux.core.specs import Capabilities
from accelmux.core.types import ServiceKind, Tier

#: Called by a backend whose process died (or whose model raised) while loaded.
CrashCallback = Callable[[str], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadReport:
    """What a finished load measured; ``None`` when the backend cannot tell."""

    weights_bytes: int | None = None
    runtime_bytes: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendRequest:
    """One client request, already validated by the gateway.

    ``endpoint`` is the OpenAI path (``/v1/chat/completions``). ``body`` holds the JSON
    fields (or the multipart text fields); ``files`` the uploaded files by field name.
    ``raw`` and ``content_type`` are the original body, for proxies that pass it through.
    ``lease_bytes`` is the memory the Manager granted (a fake allocates it).
    """

    request_id: str
    service: str
    kind: ServiceKind
    endpoint: str
    body: dict[str, Any]
    stream: bool = False
    files: dict[str, bytes] = field(default_factory=dict)
    #: (filename, content type) of each uploaded file, as the client sent them.
    file_info: dict[str, tuple[str, str]] = field(default_factory=dict)
    raw: bytes = b""
    content_type: str = "application/json"
    lease_bytes: int = 0


@dataclass(slots=True, kw_only=True)
class BackendResponse:
    """A backend's answer: a whole body, or a stream of already-framed bytes (SSE).

    ``peak_bytes`` is the request's measured peak memory when known; a streaming backend
    sets it when its stream ends.
    """

    status: int = 200
    content_type: str = "application/json"
    body: bytes = b""
    stream: AsyncIterator[bytes] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    peak_bytes: int | None = None
    #: Frees what the stream holds (an upstream connection) if it is never consumed.
    release: Callable[[], None] | None = None
    #: Seconds the backend took once the request was dispatched to it (set by the
    #: runtime for a whole-body answer; the queue wait before it is not in it).
    run_s: float | None = None


@runtime_checkable
class Backend(Protocol):
    """What the runtime needs from anything that hosts a service's model."""

    #: The service this backend serves.
    service: str

    @property
    def capabilities(self) -> Capabilities:
        """What this backend can do (resize live or at the next load, pause, park,
        sleep, measured peaks); the policy uses nothing it does not declare."""
        ...

    async def load(
        self, *, weights_bytes: int, runtime_bytes: int, kv_pool_bytes: int
    ) -> LoadReport:
        """Bring the model up with the granted sizes; raise BackendError on failure."""
        ...

    async def unload(self, *, tier: Tier = Tier.COLD) -> None:
        """Free the device memory. ``cold``: release everything (stop the process, free
        the model). ``parked`` (declared ``host_cache``): keep the weights in host RAM
        for a faster next load. ``sleeping`` (declared ``sleep``): the process stays and
        sleeps with its weights in host RAM; the next ``load`` wakes it. Idempotent."""
        ...

    async def pause(self, request_id: str, *, park: bool) -> None:
        """Pause the running request between tokens (declared ``pause``); its stream
        stays open and sends nothing until :meth:`resume`. ``park`` (declared ``park``):
        also save its KV state off the device. Raise BackendError when it cannot; a
        request that already ended is not an error."""
        ...

    async def resume(self, request_id: str) -> None:
        """Continue a paused request where it stopped (restoring a parked KV state),
        with no lost or repeated output. A request that already ended is not an error."""
        ...

    async def resize(self, kv_pool_bytes: int) -> None:
        """Set the elastic KV pool of the loaded model now (declared ``resize: live``);
        raise BackendError when it did not take (the old pool stays)."""
        ...

    async def handle(self, request: BackendRequest) -> BackendResponse:
        """Serve one request; raise BackendError when the backend failed."""
        ...

    def memory_bytes(self) -> int | None:
        """Bytes this backend allocated inside accelmux's own process (None: none)."""
        ...

    def pids(self) -> list[int]:
        """Root process ids whose process trees belong to this service."""
        ...

    def set_crash_callback(self, callback: CrashCallback) -> None:
        """Register the function the backend calls when it dies while loaded."""
        ...

    def describe(self) -> dict[str, Any]:
        """Backend facts for the status page (type, pid, port, recent log lines)."""
        ...

    async def close(self) -> None:
        """Final cleanup at shutdown (after unload)."""
        ...


def can_pause(backend: Backend, request: BackendRequest) -> bool:
    """Whether ``backend`` could pause ``request`` between tokens: what its
    ``can_pause(request)`` says, for a backend that has one; False otherwise (a backend
    that cannot tell is never asked to pause)."""
    decide = getattr(backend, "can_pause", None)
    return bool(decide(request)) if callable(decide) else False
