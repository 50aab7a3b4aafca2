"""The Backend of a worker-hosted service, and the pool of inference workers behind them.

Every service with ``backend: {type: worker}`` is hosted by the one shared worker of
a :class:`WorkerPool`; ``isolated: true`` gives a service a worker of its own (same code,
its own process: a crash there takes only that service down, and nothing is shared).

Memory seen by the daemon's monitors: an isolated service is measured as its worker's
process tree (PSS). A shared worker's PSS is split between its services in proportion
to what the worker attributes to each (weights, runtime, KV, active; a shared model is
carried by the service that loaded it first), so the per-service figures add up to the
worker's measured memory and none of it shows as foreign. Weights a service parked
(``unload(tier=parked)``: the worker keeps its GGUF file mapped in host RAM) are that
service's while it is unloaded, and are left out of the split between the loaded ones.

Pause and resume name the Manager's request id (``BackendRequest.request_id``), which
each infer carries to the worker; the worker pauses the request's stream between two
chunks. The backend remembers the requests it sent (streamed or not) and the ones that
ended lately: a pause or resume of an ended one is a no-op, a pause that arrives before
its request is sent makes the request start paused, and a resume of a request it never
saw is a BackendError.

A paused request outlives an unload of its service (any tier): the worker keeps what it
parked (its llama.cpp sequence) in host RAM and the daemon's stream stays open, sending
nothing, until the service is loaded again and the request resumed; a resume before that
load is a BackendError and leaves it paused. Those bytes (``parked_streams`` in the
worker's report) are the service's while it is unloaded. :meth:`WorkerBackend.close`
(the daemon stops) ends them.
"""

from __future__ import annotations

import contextlib
import json
from collections import OrderedDict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from accelmux.backends.base import BackendRequest, BackendResponse, CrashCallback, LoadReport
from accelmux.config.backends import WorkerBackendConfig
from accelmux.core.specs import Capabilities
from accelmux.core.types import ServiceKind, Tier
from accelmux.errors import BackendCrashedError, BackendError, RequestError
from accelmux.worker import protocol
from accelmux.worker.client import WorkerClient

LOAD_TIMEOUT_S = 300.0
REQUEST_TIMEOUT_S = 600.0
#: Ended request ids (and pauses that came before their request) remembered per service.
REMEMBERED = 1024


def _remember(ids: OrderedDict[str, bool], key: str, value: bool) -> None:
    ids[key] = value
    ids.move_to_end(key)
    while len(ids) > REMEMBERED:
        ids.popitem(last=False)


def _error_response(exc: RequestError) -> BackendResponse:
    body = {
        "error": {
            "message": str(exc),
            "type": "invalid_request_error",
            "param": exc.field,
            "code": "invalid_request" if exc.status < 500 else "backend_error",
        }
    }
    return BackendResponse(status=exc.status, body=json.dumps(body).encode())


class WorkerPool:
    """The shared worker and the isolated ones; builds each hosted service's backend."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.shared = WorkerClient("shared", data_dir)
        self.clients: dict[str, WorkerClient] = {"shared": self.shared}
        self.backends: dict[str, WorkerBackend] = {}

    def backend(
        self,
        service: str,
        kind: ServiceKind,
        cfg: WorkerBackendConfig,
        *,
        gpu_index: int | None = None,
        device: str = "",
    ) -> WorkerBackend:
        """``gpu_index``: the GPU of the service's device (an nvidia one), where the
        worker runs its model when it can (:mod:`accelmux.models.offload`); ``device``:
        the device's name, part of the key of the model copy it may share."""
        if cfg.isolated:
            client = WorkerClient(service, self.data_dir)
            self.clients[service] = client
        else:
            client = self.shared
        backend = WorkerBackend(service, kind, cfg, client, self)
        backend.gpu_index = gpu_index
        backend.device = device
        self.backends[service] = backend
        return backend

    def hosted_on(self, client: WorkerClient) -> list[str]:
        return [name for name, b in self.backends.items() if b.client is client]


class WorkerBackend:
    """A service whose model runs in an inference worker."""

    def __init__(
        self,
        service: str,
        kind: ServiceKind,
        cfg: WorkerBackendConfig,
        client: WorkerClient,
        pool: WorkerPool,
    ) -> None:
        self.service = service
        self.kind = kind
        self.cfg = cfg
        self.client = client
        self.pool = pool
        self.loaded = False
        #: its weights are parked in the worker (host RAM) while it is unloaded
        self.parked = False
        self.last_load: dict[str, Any] = {}
        self.last_pause: dict[str, Any] = {}
        #: the GPU of its device (None: the CPU)
        self.gpu_index: int | None = None
        #: its device's name: services share a loaded model only on the same device
        self.device = ""
        self._on_crash: CrashCallback | None = None
        self._sent: dict[str, bool] = {}  # request id -> streamed, while it runs
        self._ended: OrderedDict[str, bool] = OrderedDict()
        self._early: OrderedDict[str, bool] = OrderedDict()  # paused before it was sent
        client.add_death_listener(self._worker_died)

    @property
    def isolated(self) -> bool:
        return self.client is not self.pool.shared

    def _worker_died(self, reason: str) -> None:
        if self.loaded:
            self.loaded = False
            if self._on_crash is not None:
                self._on_crash(reason)

    # -- lifecycle ------------------------------------------------------------------------
    async def load(
        self, *, weights_bytes: int, runtime_bytes: int, kv_pool_bytes: int
    ) -> LoadReport:
        await self.client.ensure_started()
        header = {
            "op": "load",
            "service": self.service,
            "kind": self.kind.value,
            "options": dict(self.cfg.options),
            "model_path": self.cfg.model_path,
            "kv_pool_bytes": kv_pool_bytes,
            "gpu_index": self.gpu_index,
            "device": self.device,
        }
        reply, _ = await self.client.call(header, timeout=LOAD_TIMEOUT_S)
        self.loaded, self.parked = True, False
        self.last_load = {k: v for k, v in reply.items() if k not in ("id", "type")}
        if reply.get("shared"):
            return LoadReport()  # the model was already loaded (and counted) for another
        runtime = int(reply["runtime_bytes"])
        if self.isolated:
            runtime += int(reply.get("base_bytes", 0))  # a whole interpreter of its own
        return LoadReport(weights_bytes=int(reply["weights_bytes"]), runtime_bytes=runtime)

    async def unload(self, *, tier: Tier = Tier.COLD) -> None:
        """``parked`` (LLMs): the worker keeps the GGUF file mapped in host RAM for the
        next load (an isolated worker stays up for it); any other tier is cold. Paused
        requests stay paused in the worker for the next load (an isolated worker stays
        up for them too)."""
        park = tier is Tier.PARKED and self.capabilities.host_cache
        was, self.loaded = self.loaded, False
        parked, self.parked = self.parked, False
        if (was or parked) and self.client.alive:
            with contextlib.suppress(BackendCrashedError):
                reply, _ = await self.client.call(
                    {
                        "op": "unload",
                        "service": self.service,
                        "tier": Tier.PARKED.value if park else Tier.COLD.value,
                    },
                    timeout=LOAD_TIMEOUT_S,
                )
                self.parked = bool(reply.get("parked"))
        if self.isolated and self.client.alive and not self.parked and not self._paused_kept():
            await self.client.close()  # its own worker: give the whole process back

    def _paused_kept(self) -> bool:
        """Streamed requests are open (paused ones stay in the worker over an unload)."""
        return any(self._sent.values())

    @property
    def capabilities(self) -> Capabilities:
        return self.cfg.capabilities(self.kind)

    def can_pause(self, request: BackendRequest) -> bool:
        """A streamed generation of a worker-hosted LLM pauses between chunks."""
        return self.capabilities.pause and request.stream and self.kind.is_llm

    async def pause(self, request_id: str, *, park: bool) -> None:
        """Pause a streamed request between chunks (returns once it took); ``park``:
        its llama.cpp sequence is also saved off the context."""
        if not self.capabilities.pause:
            raise BackendError(f"{self.service}: this backend does not declare pause")
        if request_id in self._ended:
            return
        streamed = self._sent.get(request_id)
        if streamed is None:  # dispatched but not sent yet: it will start paused
            _remember(self._early, request_id, park)
            return
        if not streamed:
            raise BackendError(
                f"{self.service}: request {request_id} is not streamed; only a streamed "
                "generation can pause"
            )
        header = {"op": "pause", "service": self.service, "request_id": request_id}
        reply, _ = await self.client.call({**header, "park": park}, timeout=LOAD_TIMEOUT_S)
        self.last_pause = {k: v for k, v in reply.items() if k not in ("id", "type")}

    async def resume(self, request_id: str) -> None:
        if request_id in self._ended:
            return
        if self._early.pop(request_id, None) is not None:
            return  # it had not started: it now starts unpaused
        streamed = self._sent.get(request_id)
        if streamed is None:
            raise BackendError(
                f"{self.service}: no request {request_id!r} to resume (none was sent here)"
            )
        if streamed:
            header = {"op": "resume", "service": self.service, "request_id": request_id}
            await self.client.call(header, timeout=LOAD_TIMEOUT_S)

    async def resize(self, kv_pool_bytes: int) -> None:
        if not self.loaded or not self.client.alive:
            raise BackendError(f"{self.service}: resize while the model is not loaded")
        reply, _ = await self.client.call(
            {"op": "resize", "service": self.service, "kv_pool_bytes": kv_pool_bytes},
            timeout=LOAD_TIMEOUT_S,
        )
        if reply.get("applied") is False:
            # The worker kept the context it had (a shared model, or a size it refused):
            # a refusal, so that the Manager keeps the old pool in its ledger.
            raise BackendError(
                f"{self.service}: the worker did not resize the KV pool to {kv_pool_bytes} B "
                f"(it holds {reply.get('kv_bytes', 'its old size')} B)"
            )

    # -- requests -------------------------------------------------------------------------
    async def handle(self, request: BackendRequest) -> BackendResponse:
        if not self.loaded:
            raise BackendCrashedError(f"{self.service}: model is not loaded")
        index, blob = protocol.pack_files(request.files)
        rid = request.request_id
        streamed = request.stream and self.kind.is_llm
        header: dict[str, Any] = {
            "op": "infer",
            "service": self.service,
            "endpoint": request.endpoint,
            "body": request.body,
            "files": index,
            "request_id": rid,
        }
        if self._early.pop(rid, None) is not None and streamed:
            header["paused"] = True  # a pause came first (a non-streamed request runs)
        self._sent[rid] = streamed
        try:
            if streamed:
                return await self._stream(header, blob, rid)
            reply, data = await self.client.call(header, blob, timeout=REQUEST_TIMEOUT_S)
        except RequestError as exc:
            self._end(rid)
            return _error_response(exc)
        except BaseException:
            self._end(rid)
            raise
        self._end(rid)
        return BackendResponse(
            status=int(reply.get("status", 200)),
            content_type=str(reply.get("content_type", "application/json")),
            body=data,
            peak_bytes=int(reply["peak_bytes"]) if reply.get("peak_bytes") is not None else None,
        )

    def _end(self, request_id: str) -> None:
        if self._sent.pop(request_id, None) is not None:
            _remember(self._ended, request_id, True)

    async def _stream(self, header: dict[str, Any], blob: bytes, rid: str) -> BackendResponse:
        chunks, final = await self.client.open_stream(header, blob)
        response = BackendResponse(content_type="text/event-stream")

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in chunks:
                    yield chunk
            finally:
                self._end(rid)
            if final.done() and not final.cancelled():
                peak = final.result().get("peak_bytes")
                response.peak_bytes = int(peak) if peak is not None else None

        response.stream = relay()
        return response

    # -- facts ----------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """What the worker attributes to this service now (bytes by category; while it
        is unloaded, its paused requests: ``paused`` and ``parked_kv``)."""
        memory = self.client.memory
        services = memory.get("services") or {}
        kept = memory.get("parked_streams") or {}
        return dict(services.get(self.service) or kept.get(self.service) or {})

    def hosted_bytes(self) -> int | None:
        """This service's share of its shared worker's measured memory (None: isolated)."""
        if self.isolated:
            return None
        memory = self.client.memory
        services: dict[str, Any] = memory.get("services") or {}
        kept = (memory.get("parked_streams") or {}).get(self.service) or {}
        if not self.loaded:  # parked weights and paused requests are its own meanwhile
            weights = int((memory.get("parked") or {}).get(self.service, 0)) if self.parked else 0
            return weights + int(kept.get("parked_kv", 0))
        mine = services.get(self.service)
        if not mine:
            return 0
        held_for_unloaded = int(memory.get("parked_bytes", 0)) + int(
            memory.get("parked_streams_bytes", 0)
        )
        total_pss = max(0, int(memory.get("pss_bytes", 0)) - held_for_unloaded)

        def attributed(entry: dict[str, Any]) -> int:
            kinds = ("weights", "runtime", "kv", "active", "parked_kv")
            return sum(int(entry.get(k, 0)) for k in kinds)

        everyone = sum(attributed(e) for e in services.values())
        if everyone <= 0:
            return total_pss // max(1, len(services))
        return total_pss * attributed(mine) // everyone

    def gpu_claim(self) -> tuple[int, int] | None:
        """(its worker's pid, the bytes the worker says this service holds on the GPU)
        for the NVIDIA monitor, which reconciles the claims of one worker with NVML's
        figure for that process; None when it is not on a GPU or its worker is not up."""
        pid = self.client.pid
        if self.gpu_index is None or pid is None or not self.client.alive or self.isolated:
            return None  # an isolated worker is its service's own process (``pids``)
        entry = (self.client.memory.get("services") or {}).get(self.service) or {}
        return pid, int(entry.get("gpu", 0)) if self.loaded else 0

    def memory_bytes(self) -> int | None:
        return None

    def pids(self) -> list[int]:
        if self.isolated and self.client.pid is not None:
            return [self.client.pid]
        return []

    def set_crash_callback(self, callback: CrashCallback) -> None:
        self._on_crash = callback

    def describe(self) -> dict[str, Any]:
        report = self.report()
        return {
            "type": "worker",
            "worker": self.client.name,
            "isolated": self.isolated,
            "pid": self.client.pid,
            "worker_starts": self.client.starts,
            "worker_pss_bytes": self.client.memory.get("pss_bytes"),
            "loaded": self.loaded,
            "component": report.get("component") or self.last_load.get("key"),
            "shared_with": report.get("shared_with", []),
            "memory": {
                k: report.get(k) for k in ("weights", "runtime", "kv", "active", "parked_kv")
            },
            "accelerator": report.get("accelerator") or self.last_load.get("accelerator"),
            "accelerator_fix": self.last_load.get("accelerator_fix") or None,
            "gpu_index": self.gpu_index,
            "gpu_bytes": report.get("gpu"),
            "live": {
                "context_tokens": report.get("context_tokens"),
                "batch_size": report.get("batch_size") if self.loaded else None,
            },
            "paused_requests": report.get("paused", 0),
            "parked": self.parked,
            "parked_bytes": (self.client.memory.get("parked") or {}).get(self.service, 0),
            "last_load": self.last_load,
            "last_pause": self.last_pause,
            "last_exit": self.client.last_exit,
        }

    async def close(self) -> None:
        """The service stops: requests still paused in the worker end (an error), and
        the worker stops with its last service."""
        self.loaded = False
        if self._paused_kept() and self.client.alive:
            header = {"op": "unload", "service": self.service, "end_paused": True}
            with contextlib.suppress(BackendError):
                await self.client.call(header, timeout=LOAD_TIMEOUT_S)
        if not self.isolated and self.pool.hosted_on(self.client)[-1:] != [self.service]:
            return  # the shared worker stops with the last of its services
        await self.client.close()
