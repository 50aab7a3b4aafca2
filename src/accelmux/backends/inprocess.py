"""Models run on a thread of the daemon's own process (tests and embedding only).

A model implements :class:`InProcessModel` with plain blocking methods; the
:class:`InProcessBackend` adapter runs them on one worker thread per model (so the event
loop never blocks) and turns them into the async :class:`~.base.Backend`. Models plug in
through :func:`register_model_factory`.

No config section selects it: ``backend: {type: worker}`` runs the real models in
accelmux's inference worker process (:mod:`accelmux.backends.worker`,
:mod:`accelmux.worker`), so a crashing model cannot take the daemon down.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, runtime_checkable

from accelmux.backends.base import BackendRequest, BackendResponse, CrashCallback, LoadReport
from accelmux.config.backends import WorkerBackendConfig
from accelmux.core.specs import Capabilities
from accelmux.core.types import ServiceKind
from accelmux.errors import BackendCrashedError, BackendError


@runtime_checkable
class InProcessModel(Protocol):
    """A model hosted in the worker. Every method may block; none is called concurrently
    with ``load``/``unload``/``resize``. ``infer`` may be called up to the service's
    concurrency at once only if the model says ``thread_safe``."""

    thread_safe: bool

    def load(self, *, kv_pool_bytes: int) -> LoadReport: ...

    def unload(self) -> None: ...

    def resize(self, kv_pool_bytes: int) -> bool: ...

    def infer(self, request: BackendRequest) -> BackendResponse:
        """A whole answer (JSON, audio, image...) with ``peak_bytes`` when known."""
        ...

    def stream(self, request: BackendRequest) -> Iterator[bytes]:
        """SSE-framed chunks of a streamed answer (LLMs)."""
        ...

    def memory_bytes(self) -> int:
        """Bytes the model holds now (weights, pools, scratch), measured or tracked."""
        ...


ModelFactory = Callable[[str, ServiceKind, WorkerBackendConfig], InProcessModel]
_FACTORIES: dict[str, ModelFactory] = {}


def register_model_factory(name: str, factory: ModelFactory) -> None:
    """Make ``name`` (a service kind or a ``options.model_type``) loadable in-process."""
    _FACTORIES[name] = factory


class InProcessBackend:
    """Adapts an :class:`InProcessModel` to the async Backend Protocol."""

    def __init__(self, service: str, kind: ServiceKind, cfg: WorkerBackendConfig) -> None:
        self.service = service
        self.kind = kind
        self.cfg = cfg
        self._model: InProcessModel | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"model-{service}")
        self._on_crash: CrashCallback | None = None

    def _factory(self) -> ModelFactory:
        key = str(self.cfg.options.get("model_type", self.kind.value))
        factory = _FACTORIES.get(key)
        if factory is None:
            raise BackendError(
                f"{self.service}: no in-process model registered for {key!r} "
                "(the in-process host is not part of this build yet)"
            )
        return factory

    async def _run(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: func(*args, **kwargs))

    async def load(
        self, *, weights_bytes: int, runtime_bytes: int, kv_pool_bytes: int
    ) -> LoadReport:
        model = self._factory()(self.service, self.kind, self.cfg)
        report: LoadReport = await self._run(model.load, kv_pool_bytes=kv_pool_bytes)
        self._model = model
        return report

    async def unload(self) -> None:
        model, self._model = self._model, None
        if model is not None:
            await self._run(model.unload)

    @property
    def capabilities(self) -> Capabilities:
        return self.cfg.capabilities(self.kind)

    async def resize(self, kv_pool_bytes: int) -> None:
        if self._model is None:
            raise BackendError(f"{self.service}: resize while the model is not loaded")
        await self._run(self._model.resize, kv_pool_bytes)

    async def handle(self, request: BackendRequest) -> BackendResponse:
        model = self._model
        if model is None:
            raise BackendCrashedError(f"{self.service}: model is not loaded")
        if request.stream and self.kind.is_llm:
            return BackendResponse(
                content_type="text/event-stream", stream=self._stream(model, request)
            )
        try:
            response: BackendResponse = await self._run(model.infer, request)
        except BackendError:
            raise
        except Exception as exc:
            raise BackendError(f"{self.service}: model raised {type(exc).__name__}: {exc}") from exc
        return response

    async def _stream(self, model: InProcessModel, request: BackendRequest) -> AsyncIterator[bytes]:
        iterator = await self._run(model.stream, request)
        sentinel = object()
        while True:
            chunk = await self._run(next, iterator, sentinel)
            if chunk is sentinel:
                return
            yield chunk

    def memory_bytes(self) -> int | None:
        return self._model.memory_bytes() if self._model is not None else 0

    def pids(self) -> list[int]:
        return []

    def set_crash_callback(self, callback: CrashCallback) -> None:
        self._on_crash = callback

    def describe(self) -> dict[str, Any]:
        return {"type": "inprocess", "loaded": self._model is not None}

    async def close(self) -> None:
        await self.unload()
        self._pool.shutdown(wait=False, cancel_futures=True)
