"""Baseline policies: what home servers do today, and the oracle upper bound.

All of them implement the :class:`~accelmux.core.policy.Policy` Protocol and act only
through the World's mutators. Policies that do not coordinate memory dispatch with a
lease of 0 and ``enforce=False``: the ledger then does not stop them, and the
simulator's physical model decides whether a peak crosses the device (an OOM).

- ``independent``: every service loads at start in its own runtime and never unloads;
  each serves its own FIFO queue up to its concurrency. No reservation per request, the
  LLM KV pool sized at its ceiling. A crashed runtime is restarted after a back-off
  (a supervisor's restart policy).
- ``static``: a fixed slice per service sized for its worst case (resident with the KV
  pool at its ceiling + concurrency x the largest request). Slices are granted in class
  order, then config order, while they fit; services left out are never loaded and
  their requests are refused.
- ``ollama-like``: one bounded FIFO (512) with head-of-line blocking while a model
  loads or another is evicted for it; a model loads when its size fits under 80% of the
  free memory, else idle models are evicted, shortest remaining keep-alive first;
  keep-alive 5 minutes; at most 3 models loaded; no priorities, no reservation.
- ``swap``: llama-swap-like: one service holds the device at a time; strict FIFO; the
  head request's service is swapped in when the current one drains; optional TTL.
- ``oracle``: infinite memory (the simulator gives it an unbounded device), everything
  loaded at start and kept warm, each service FIFO up to its concurrency.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from accelmux.core.policy import Policy
from accelmux.core.state import RequestState, ServiceState, World
from accelmux.core.types import Reason, ServiceKind, ServiceStatus

#: Largest request the ``static`` policy sizes a slot for, in the kind's units
#: (megapixels for image and detection, seconds of audio for ASR, characters for TTS,
#: texts for embeddings). A fixed partition has to pick some worst case up front.
WORST_CASE_UNITS: dict[ServiceKind, float] = {
    ServiceKind.IMAGE: 1.05,  # 1024 x 1024
    ServiceKind.DETECT: 0.41,  # 640 x 640
    ServiceKind.CAMERA: 0.41,
    ServiceKind.ASR: 30.0,  # Whisper's 30 s window
    ServiceKind.TTS: 1000.0,
    ServiceKind.EMBEDDINGS: 64.0,
    ServiceKind.CHAT: 0.0,
    ServiceKind.COMPLETION: 0.0,
}

OLLAMA_MAX_QUEUE = 512
OLLAMA_MAX_LOADED = 3
OLLAMA_KEEP_ALIVE_S = 300.0
OLLAMA_FIT_FRACTION = 0.8


def _fifo(world: World) -> list[RequestState]:
    return sorted(world.waiting.values(), key=lambda r: r.seq)


def _too_large_for_pool(world: World, req: RequestState) -> bool:
    """An LLM request whose KV exceeds the largest pool can never run: refuse it."""
    p = world.services[req.service].spec.profile
    if p.kv_ceiling and req.estimate.kv_bytes > p.kv_ceiling:
        world.reject(
            req,
            reason=Reason.TOO_LARGE,
            retry_after_s=0.0,
            detail=f"needs {req.estimate.kv_bytes} B of KV, pool {p.kv_ceiling} B",
        )
        return True
    return False


def _queue_full(world: World, req: RequestState, seen: set[str], limit: int, count: int) -> bool:
    """Reject a newly arrived request when ``count`` others already wait (limit reached)."""
    if req.request_id in seen:
        return False
    seen.add(req.request_id)
    if count >= limit:
        world.reject(
            req,
            reason=Reason.QUEUE_FULL,
            retry_after_s=1.0,
            detail=f"{count} waiting (limit {limit})",
        )
        return True
    return False


def _load_whole(world: World, svc: ServiceState, *, reason: Reason, detail: str) -> None:
    """Load ``svc`` with its KV pool at the ceiling, unchecked by the ledger."""
    world.load(
        svc,
        reason=reason,
        kv_pool=svc.spec.profile.kv_ceiling,
        enforce=False,
        detail=detail,
    )


def _resident_whole(svc: ServiceState) -> int:
    """Weights, runtime and the KV pool at its ceiling."""
    p = svc.spec.profile
    return p.weights + p.runtime + p.kv_ceiling


def _restart_crashed(world: World, svc: ServiceState) -> None:
    if svc.status is ServiceStatus.CRASHED and world.now >= svc.backoff_until:
        _load_whole(world, svc, reason=Reason.RELOAD_AFTER_CRASH, detail="supervisor restart")


def _earliest_after(times: list[float], now: float) -> float | None:
    future = [t for t in times if t > now]
    return min(future) if future else None


def _backoff_wakeup(world: World, now: float) -> float | None:
    times = [s.backoff_until for s in world.services.values() if s.status is ServiceStatus.CRASHED]
    return _earliest_after(times, now)


def _admit(
    world: World, req: RequestState, svc: ServiceState, seen: set[str], counts: dict[str, int]
) -> bool:
    """Count ``req`` in its service's queue (True), or reject it when that queue is full."""
    if _queue_full(world, req, seen, svc.spec.queue_limit, counts.get(svc.name, 0)):
        return False
    counts[svc.name] = counts.get(svc.name, 0) + 1
    return True


def _dispatch_or_wait(
    world: World,
    req: RequestState,
    svc: ServiceState,
    *,
    reason: Reason,
    active_bytes: int,
    busy: str,
) -> bool:
    """Dispatch ``req`` on its own runtime when it is up with a free slot (True), else queue it."""
    if svc.status is ServiceStatus.LOADING:
        world.enqueue(req, reason=Reason.LOADING, detail="runtime starting")
    elif svc.status is not ServiceStatus.LOADED:
        world.enqueue(req, reason=Reason.BACKOFF, detail="runtime down, restarting")
    elif len(svc.inflight) >= svc.spec.concurrency:
        world.enqueue(req, reason=Reason.CONCURRENCY_LIMIT, detail=busy)
    elif world.dispatch(req, reason=reason, active_bytes=active_bytes, enforce=False):
        return True
    else:
        world.enqueue(req, reason=Reason.NO_MEMORY, detail="KV pool full")
    return False


class _WarmPerServicePolicy:
    """Everything loaded at start; each service serves its own FIFO, uncoordinated."""

    #: ``detail`` of the preload actions.
    preload_detail = ""
    #: Dispatch with the calibrated active bytes (else 0: no reservation).
    projected = False
    #: Reason recorded on each dispatch.
    dispatch_reason = Reason.UNCOORDINATED

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def start(self, world: World, now: float) -> None:
        for svc in world.services.values():
            _load_whole(world, svc, reason=Reason.PRELOAD, detail=self.preload_detail)

    def decide(self, world: World, now: float) -> None:
        for svc in world.services.values():
            _restart_crashed(world, svc)
        counts: dict[str, int] = {}
        for req in _fifo(world):
            svc = world.services[req.service]
            if _too_large_for_pool(world, req):
                continue
            if not _admit(world, req, svc, self._seen, counts):
                continue
            active = world.projected_active(req) if self.projected else 0
            if _dispatch_or_wait(
                world,
                req,
                svc,
                reason=self.dispatch_reason,
                active_bytes=active,
                busy="all slots busy",
            ):
                counts[svc.name] -= 1

    def next_wakeup(self, world: World, now: float) -> float | None:
        return _backoff_wakeup(world, now)


class IndependentPolicy(_WarmPerServicePolicy):
    """Every service in its own runtime, loaded at start, never coordinated."""

    name = "independent"
    infinite_memory = False
    enforces_budget = False
    preload_detail = "starts with the server"
    projected = False
    dispatch_reason = Reason.UNCOORDINATED


class StaticPolicy:
    """A fixed slice per service sized for its worst case; what does not fit is refused."""

    name = "static"
    infinite_memory = False
    enforces_budget = False

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self.admitted: set[str] = set()
        self.slot_bytes: dict[str, int] = {}

    @staticmethod
    def worst_request(world: World, svc: ServiceState) -> int:
        p = svc.spec.profile
        units = WORST_CASE_UNITS.get(svc.spec.kind, 0.0)
        return math.ceil((p.workspace + p.per_unit * units) * world.knobs.safety_factor)

    def slice_bytes(self, world: World, svc: ServiceState) -> int:
        return _resident_whole(svc) + svc.spec.concurrency * self.worst_request(world, svc)

    def start(self, world: World, now: float) -> None:
        order = sorted(world.services.values(), key=lambda s: int(s.spec.cls))
        used: dict[str, int] = {d: 0 for d in world.devices}
        for svc in order:
            dev = svc.spec.device
            size = self.slice_bytes(world, svc)
            if used[dev] + size > world.devices[dev].usable_bytes:
                continue
            used[dev] += size
            self.admitted.add(svc.name)
            self.slot_bytes[svc.name] = self.worst_request(world, svc)
            _load_whole(world, svc, reason=Reason.PRELOAD, detail=f"static slice {size} B")

    def decide(self, world: World, now: float) -> None:
        counts: dict[str, int] = {}
        for svc in world.services.values():
            if svc.name in self.admitted:
                _restart_crashed(world, svc)
        for req in _fifo(world):
            svc = world.services[req.service]
            if svc.name not in self.admitted:
                world.reject(
                    req,
                    reason=Reason.SERVICE_UNAVAILABLE,
                    retry_after_s=0.0,
                    detail="no static slice fits this service",
                )
                continue
            if _too_large_for_pool(world, req):
                continue
            active = math.ceil(req.estimate.active_bytes * world.knobs.safety_factor)
            if active > self.slot_bytes[svc.name]:
                world.reject(
                    req,
                    reason=Reason.TOO_LARGE,
                    retry_after_s=0.0,
                    detail=f"needs {active} B, slot is {self.slot_bytes[svc.name]} B",
                )
                continue
            if not _admit(world, req, svc, self._seen, counts):
                continue
            if _dispatch_or_wait(
                world, req, svc, reason=Reason.FITS, active_bytes=active, busy="slice slots busy"
            ):
                counts[svc.name] -= 1

    def next_wakeup(self, world: World, now: float) -> float | None:
        return _backoff_wakeup(world, now)


class OllamaLikePolicy:
    """One FIFO, keep-alive 5 min, at most 3 models, evict idle shortest keep-alive first."""

    name = "ollama-like"
    infinite_memory = False
    enforces_budget = False

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def start(self, world: World, now: float) -> None:
        return None

    @staticmethod
    def _free(world: World, device: str) -> int:
        dev = world.devices[device]
        return dev.budget_bytes - world.ledger.foreign(device) - world.ledger.committed(device)

    def decide(self, world: World, now: float) -> None:
        for svc in world.services.values():
            if (
                svc.status is ServiceStatus.LOADED
                and svc.idle
                and svc.waiting_count == 0
                and now - svc.last_used >= OLLAMA_KEEP_ALIVE_S
            ):
                world.unload(svc, reason=Reason.TTL_EXPIRED, detail="keep-alive expired")
        blocked = False
        count = 0
        for req in _fifo(world):
            if _queue_full(world, req, self._seen, OLLAMA_MAX_QUEUE, count):
                continue
            count += 1
            svc = world.services[req.service]
            if _too_large_for_pool(world, req):
                count -= 1
                continue
            if blocked:
                world.enqueue(req, reason=Reason.LOADING, detail="behind a model load")
                continue
            if svc.status is ServiceStatus.LOADED:
                if len(svc.inflight) >= svc.spec.concurrency:
                    world.enqueue(req, reason=Reason.CONCURRENCY_LIMIT, detail="runner busy")
                elif world.dispatch(
                    req, reason=Reason.UNCOORDINATED, active_bytes=0, enforce=False
                ):
                    count -= 1
                else:
                    world.enqueue(req, reason=Reason.NO_MEMORY, detail="KV pool full")
            elif svc.status is ServiceStatus.LOADING:
                world.enqueue(req, reason=Reason.LOADING, detail="model loading")
            elif svc.status is ServiceStatus.UNLOADING:
                world.enqueue(req, reason=Reason.LOADING, detail="model unloading")
                blocked = True
            else:
                blocked = not self._load_for(world, req, svc)

    def _load_for(self, world: World, req: RequestState, svc: ServiceState) -> bool:
        """Load ``svc`` now if it fits (True); else evict idle models and block (False)."""
        dev = svc.spec.device
        need = _resident_whole(svc)
        holders = [s for s in world.services_by_device[dev] if s.holds_memory]
        # With nothing left to evict it loads anyway (Ollama then offloads layers to
        # the CPU; here the model is loaded whole and the physical model decides).
        if not holders or (
            len(holders) < OLLAMA_MAX_LOADED
            and need <= OLLAMA_FIT_FRACTION * self._free(world, dev)
        ):
            _load_whole(world, svc, reason=Reason.DEMAND, detail=f"for {req.request_id}")
            world.enqueue(req, reason=Reason.LOADING, detail="cold start")
            return True
        if any(s.status is ServiceStatus.UNLOADING for s in holders):
            world.enqueue(req, reason=Reason.NO_MEMORY, detail="waiting for an unload")
            return False
        # Ollama counts a runner idle when nothing runs on it: requests queued behind the
        # head of line do not pin it (they could not run before the head anyway).
        idle = [s for s in holders if s.status is ServiceStatus.LOADED and s.idle]
        idle.sort(key=lambda s: (s.last_used + OLLAMA_KEEP_ALIVE_S, s.name))
        free = self._free(world, dev)
        loaded = len(holders)
        for victim in idle:
            if loaded < OLLAMA_MAX_LOADED and need <= OLLAMA_FIT_FRACTION * free:
                break
            world.unload(victim, reason=Reason.EVICTED_FOR_MEMORY, detail=f"for {svc.name}")
            free += victim.resident_bytes
            loaded -= 1
        world.enqueue(req, reason=Reason.NO_MEMORY, detail="waiting for room")
        return False

    def next_wakeup(self, world: World, now: float) -> float | None:
        times = [
            s.last_used + OLLAMA_KEEP_ALIVE_S
            for s in world.services.values()
            if s.status is ServiceStatus.LOADED and s.idle
        ]
        return _earliest_after(times, now)


class SwapPolicy:
    """llama-swap-like: one service resident at a time, strict FIFO, optional TTL."""

    name = "swap"
    infinite_memory = False
    enforces_budget = False

    def __init__(self, *, use_ttl: bool = True) -> None:
        self._seen: set[str] = set()
        self.use_ttl = use_ttl

    def start(self, world: World, now: float) -> None:
        return None

    def decide(self, world: World, now: float) -> None:
        queue = _fifo(world)
        counts: dict[str, int] = {}
        live: list[RequestState] = []
        for req in queue:
            svc = world.services[req.service]
            if _too_large_for_pool(world, req):
                continue
            if _admit(world, req, svc, self._seen, counts):
                live.append(req)
        holders = [s for s in world.services.values() if s.holds_memory]
        current = holders[0] if holders else None
        for req in live:
            svc = world.services[req.service]
            if current is None:
                _load_whole(world, svc, reason=Reason.SWAP, detail=f"swap in for {req.request_id}")
                current = svc
                world.enqueue(req, reason=Reason.LOADING, detail="swapping in")
                continue
            if svc is not current:
                if current.status is ServiceStatus.LOADED and current.idle:
                    world.unload(current, reason=Reason.SWAP, detail=f"swap to {svc.name}")
                world.enqueue(req, reason=Reason.LOADING, detail=f"waits for {current.name}")
                break
            if svc.status is not ServiceStatus.LOADED:
                world.enqueue(req, reason=Reason.LOADING, detail=svc.status.value)
            elif len(svc.inflight) >= svc.spec.concurrency:
                world.enqueue(req, reason=Reason.CONCURRENCY_LIMIT, detail="all slots busy")
            elif not world.dispatch(
                req, reason=Reason.UNCOORDINATED, active_bytes=0, enforce=False
            ):
                world.enqueue(req, reason=Reason.NO_MEMORY, detail="KV pool full")
        if self.use_ttl and current is not None and not world.waiting:
            ttl = current.spec.ttl_s
            if (
                current.status is ServiceStatus.LOADED
                and current.idle
                and ttl > 0
                and now - current.last_used >= ttl
            ):
                world.unload(current, reason=Reason.TTL_EXPIRED, detail="ttl")

    def next_wakeup(self, world: World, now: float) -> float | None:
        if not self.use_ttl:
            return None
        times = [
            s.last_used + s.spec.ttl_s
            for s in world.services.values()
            if s.status is ServiceStatus.LOADED and s.idle and s.spec.ttl_s > 0
        ]
        return _earliest_after(times, now)


class OraclePolicy(_WarmPerServicePolicy):
    """Infinite memory, everything warm: the upper bound on what any policy can reach."""

    name = "oracle"
    infinite_memory = True
    enforces_budget = False
    preload_detail = "all warm"
    projected = True
    dispatch_reason = Reason.FITS


BASELINES: dict[str, Callable[[], Policy]] = {
    "independent": IndependentPolicy,
    "static": StaticPolicy,
    "ollama-like": OllamaLikePolicy,
    "swap": SwapPolicy,
    "oracle": OraclePolicy,
}
