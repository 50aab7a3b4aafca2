"""Baseline policies: what home servers do today, and the oracle upper bound.

They are the simulator's yardsticks, not part of the product: the daemon runs one only
when its config names it, for comparison.

All of them implement the :class:`~accelmux.core.policy.Policy` Protocol and act only
through the World's mutators. Policies that do not coordinate memory dispatch with a
lease of 0 and ``enforce=False``: the ledger then does not stop them, and the
simulator's physical model decides whether a peak crosses the device (an OOM).

- ``independent``: every service loads at start in its own runtime and never unloads;
  each serves its own FIFO queue up to its concurrency. No reservation per request, the
  LLM KV pool sized at its ceiling. A crashed runtime is restarted after a back-off
  (a supervisor's restart policy). What a compose file of one container per model does.
- ``static``: a fixed slice per service sized for its worst case (resident with the KV
  pool at its ceiling + concurrency x the largest request). Slices are granted in class
  order, then config order, while they fit; services left out are never loaded and
  their requests are refused. What per-process memory caps do (vLLM's
  ``--gpu-memory-utilization``, llama.cpp's fixed context) when sized for the worst case.
- ``ollama+containers``: Ollama's scheduler (one FIFO, one load at a time, keep-alive,
  ``OLLAMA_MAX_LOADED_MODELS`` over its own models) for the chat, completion and
  embeddings services; every other service its own always-on process beside it.
- ``llama-swap``: llama-swap's groups (the pinned services in a persistent group, the
  rest it proxies in one swap group), TTL per service; detection beside it.
- ``oracle``: infinite memory (the simulator gives it an unbounded device), everything
  loaded at start and kept warm, each service FIFO up to its concurrency.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from accelmux.core.events import Demand
from accelmux.core.placement import first_up
from accelmux.core.policy import Policy
from accelmux.core.specs import ServiceSpec
from accelmux.core.types import Reason, Residency, ServiceKind, ServiceStatus
from accelmux.core.world import RequestState, ServiceState, WorldOps, WorldView

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

#: What an Ollama server hosts: its API serves chat, completion and embedding models
#: (``server/routes.go``: /api/chat, /api/generate, /api/embed and the OpenAI-compatible
#: /v1/chat/completions, /v1/completions, /v1/embeddings). Speech, images and detection
#: run beside it as their own processes.
OLLAMA_KINDS = frozenset({ServiceKind.CHAT, ServiceKind.COMPLETION, ServiceKind.EMBEDDINGS})
#: What llama-swap can put behind its proxy: any OpenAI-compatible server (llama-server,
#: whisper.cpp's server for /v1/audio/transcriptions, a TTS server for /v1/audio/speech,
#: stable-diffusion.cpp's server for images). Camera object detection (Frigate-style)
#: has no such endpoint and runs as its own process.
LLAMA_SWAP_KINDS = frozenset(ServiceKind) - {ServiceKind.DETECT, ServiceKind.CAMERA}


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


@dataclass(frozen=True, slots=True, kw_only=True)
class OllamaSettings:
    """Ollama's knobs (``envconfig/config.go``), defaults as Ollama ships them except
    ``pinned_forever`` (a user who pins a model sets its ``keep_alive`` to -1)."""

    hosted_kinds: frozenset[ServiceKind] = OLLAMA_KINDS
    #: ``OLLAMA_MAX_LOADED_MODELS`` per device (3 per GPU by default); None: no cap.
    max_loaded_models: int | None = 3
    #: ``OLLAMA_NUM_PARALLEL``: requests one model runs at once (default 1).
    num_parallel: int = 1
    #: ``OLLAMA_KEEP_ALIVE``: idle seconds before a model unloads (default 5 minutes).
    keep_alive_s: float = 300.0
    #: ``keep_alive: -1`` for the services the config pins.
    pinned_forever: bool = True
    #: ``OLLAMA_GPU_OVERHEAD``: bytes per GPU left out of Ollama's fit check (default 0).
    gpu_overhead_bytes: int = 0
    #: ``OLLAMA_MAX_QUEUE``: pending requests beyond which new ones are refused (512).
    max_queue: int = 512

    def __post_init__(self) -> None:
        _check(self.max_loaded_models is None or self.max_loaded_models >= 1, "max_loaded >= 1")
        _check(self.num_parallel >= 1, "num_parallel must be >= 1")
        _check(self.keep_alive_s >= 0, "keep_alive_s must be >= 0")
        _check(self.gpu_overhead_bytes >= 0, "gpu_overhead_bytes must be >= 0")
        _check(self.max_queue >= 1, "max_queue must be >= 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class SwapGroup:
    """One llama-swap group (``groups:`` in its config)."""

    name: str
    #: Service names, ``*``, or ``residency:``/``class:``/``kind:`` VALUE selectors.
    members: tuple[str, ...]
    swap: bool = True
    exclusive: bool = True
    persistent: bool = False


#: The layout llama-swap's README recommends for always-on models: the pinned (voice)
#: services in a persistent group that never swaps, everything else in one swap group.
PINNED_PERSISTENT = (
    SwapGroup(
        name="always-on",
        members=("residency:pinned",),
        swap=False,
        exclusive=False,
        persistent=True,
    ),
    SwapGroup(name="on-demand", members=("*",), swap=True, exclusive=False),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class LlamaSwapSettings:
    """llama-swap's knobs: what it proxies, its groups, TTLs and startup preload."""

    hosted_kinds: frozenset[ServiceKind] = LLAMA_SWAP_KINDS
    #: Groups in order (a service joins the first that matches); () = no groups.
    groups: tuple[SwapGroup, ...] = PINNED_PERSISTENT
    #: Unload a model idle for its service's ``ttl_s`` (llama-swap's per-model ``ttl``).
    use_ttl: bool = True
    #: Start the persistent groups' models with the server (``hooks.on_startup.preload``).
    preload_persistent: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class BaselineSettings:
    """The knobs of every configurable baseline (``BaselinePolicyConfig``'s sections)."""

    ollama: OllamaSettings = field(default_factory=OllamaSettings)
    llama_swap: LlamaSwapSettings = field(default_factory=LlamaSwapSettings)


def _fifo(world: WorldView) -> list[RequestState]:
    return sorted(world.waiting.values(), key=lambda r: r.seq)


def _too_large_for_pool(world: WorldView, ops: WorldOps, req: RequestState) -> bool:
    """An LLM request whose KV exceeds the largest pool can never run: refuse it."""
    svc = world.services[req.service]
    limit = svc.kv_request_limit
    if svc.spec.profile.kv_ceiling and req.estimate.kv_bytes > limit:
        ops.reject(
            req,
            reason=Reason.TOO_LARGE,
            retry_after_s=0.0,
            detail=f"needs {req.estimate.kv_bytes} B of KV, pool {limit} B"
            + (" per slot" if svc.spec.capabilities.kv_per_slot else ""),
        )
        return True
    return False


def _queue_full(
    world: WorldView, ops: WorldOps, req: RequestState, seen: set[str], limit: int, count: int
) -> bool:
    """Reject a newly arrived request when ``count`` others already wait (limit reached)."""
    if req.request_id in seen:
        return False
    seen.add(req.request_id)
    if count >= limit:
        ops.reject(
            req,
            reason=Reason.QUEUE_FULL,
            retry_after_s=1.0,
            detail=f"{count} waiting (limit {limit})",
        )
        return True
    return False


def _load_whole(
    world: WorldView, ops: WorldOps, svc: ServiceState, *, reason: Reason, detail: str
) -> None:
    """Load ``svc`` with its KV pool at the ceiling, unchecked by the ledger."""
    ops.load(
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


def _restart_crashed(world: WorldView, ops: WorldOps, svc: ServiceState) -> None:
    if svc.status is ServiceStatus.CRASHED and world.now >= svc.backoff_until:
        _load_whole(world, ops, svc, reason=Reason.RELOAD_AFTER_CRASH, detail="supervisor restart")


def _earliest_after(times: list[float], now: float) -> float | None:
    future = [t for t in times if t > now]
    return min(future) if future else None


def _backoff_wakeup(world: WorldView, now: float) -> float | None:
    times = [s.backoff_until for s in world.services.values() if s.status is ServiceStatus.CRASHED]
    return _earliest_after(times, now)


def _admit(
    world: WorldView,
    ops: WorldOps,
    req: RequestState,
    svc: ServiceState,
    seen: set[str],
    counts: dict[str, int],
) -> bool:
    """Count ``req`` in its service's queue (True), or reject it when that queue is full."""
    if _queue_full(world, ops, req, seen, svc.spec.queue_limit, counts.get(svc.name, 0)):
        return False
    counts[svc.name] = counts.get(svc.name, 0) + 1
    return True


def _dispatch_or_wait(
    world: WorldView,
    ops: WorldOps,
    req: RequestState,
    svc: ServiceState,
    *,
    reason: Reason,
    active_bytes: int,
    busy: str,
) -> bool:
    """Dispatch ``req`` on its own runtime when it is up with a free slot (True), else queue it."""
    if svc.status is ServiceStatus.LOADING:
        ops.enqueue(req, reason=Reason.LOADING, detail="runtime starting")
    elif svc.status is not ServiceStatus.LOADED:
        ops.enqueue(req, reason=Reason.BACKOFF, detail="runtime down, restarting")
    elif len(svc.inflight) >= svc.spec.concurrency:
        ops.enqueue(req, reason=Reason.CONCURRENCY_LIMIT, detail=busy)
    elif ops.dispatch(req, reason=reason, active_bytes=active_bytes, enforce=False):
        return True
    else:
        ops.enqueue(req, reason=Reason.NO_MEMORY, detail="KV pool full")
    return False


def _serve_own_queues(
    world: WorldView,
    ops: WorldOps,
    requests: list[RequestState],
    seen: set[str],
    *,
    reason: Reason,
    projected: bool,
) -> None:
    """Each service serves its own FIFO on its own runtime, uncoordinated."""
    counts: dict[str, int] = {}
    for req in requests:
        svc = world.services[req.service]
        if _too_large_for_pool(world, ops, req):
            continue
        if not _admit(world, ops, req, svc, seen, counts):
            continue
        active = world.projected_active(req) if projected else 0
        if _dispatch_or_wait(
            world, ops, req, svc, reason=reason, active_bytes=active, busy="all slots busy"
        ):
            counts[svc.name] -= 1


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

    def start(self, world: WorldView, ops: WorldOps, now: float) -> None:
        for svc in world.services.values():
            _load_whole(world, ops, svc, reason=Reason.PRELOAD, detail=self.preload_detail)

    def decide(self, world: WorldView, ops: WorldOps, now: float) -> None:
        for svc in world.services.values():
            _restart_crashed(world, ops, svc)
        _serve_own_queues(
            world,
            ops,
            _fifo(world),
            self._seen,
            reason=self.dispatch_reason,
            projected=self.projected,
        )

    def next_wakeup(self, world: WorldView, now: float) -> float | None:
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
    def worst_request(world: WorldView, svc: ServiceState) -> int:
        p = svc.spec.profile
        units = WORST_CASE_UNITS.get(svc.spec.kind, 0.0)
        return math.ceil((p.workspace + p.per_unit * units) * world.knobs.safety_factor)

    def slice_bytes(self, world: WorldView, svc: ServiceState) -> int:
        return _resident_whole(svc) + svc.spec.concurrency * self.worst_request(world, svc)

    def start(self, world: WorldView, ops: WorldOps, now: float) -> None:
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
            _load_whole(world, ops, svc, reason=Reason.PRELOAD, detail=f"static slice {size} B")

    def decide(self, world: WorldView, ops: WorldOps, now: float) -> None:
        counts: dict[str, int] = {}
        for svc in world.services.values():
            if svc.name in self.admitted:
                _restart_crashed(world, ops, svc)
        for req in _fifo(world):
            svc = world.services[req.service]
            if svc.name not in self.admitted:
                ops.reject(
                    req,
                    reason=Reason.SERVICE_UNAVAILABLE,
                    retry_after_s=0.0,
                    detail="no static slice fits this service",
                )
                continue
            if _too_large_for_pool(world, ops, req):
                continue
            active = math.ceil(req.estimate.active_bytes * world.knobs.safety_factor)
            if active > self.slot_bytes[svc.name]:
                ops.reject(
                    req,
                    reason=Reason.TOO_LARGE,
                    retry_after_s=0.0,
                    detail=f"needs {active} B, slot is {self.slot_bytes[svc.name]} B",
                )
                continue
            if not _admit(world, ops, req, svc, self._seen, counts):
                continue
            if _dispatch_or_wait(
                world,
                ops,
                req,
                svc,
                reason=Reason.FITS,
                active_bytes=active,
                busy="slice slots busy",
            ):
                counts[svc.name] -= 1

    def next_wakeup(self, world: WorldView, now: float) -> float | None:
        return _backoff_wakeup(world, now)


# ---- The proxies: Ollama and llama-swap, with what they do not host beside them ----------


def _split_hosted(
    world: WorldView, hosts: Callable[[ServiceState], bool]
) -> tuple[list[RequestState], list[RequestState]]:
    """The FIFO split into requests for hosted services and for the others."""
    hosted: list[RequestState] = []
    others: list[RequestState] = []
    for req in _fifo(world):
        (hosted if hosts(world.services[req.service]) else others).append(req)
    return hosted, others


def _spare_replica(world: WorldView, svc: ServiceState) -> bool:
    """A replica other than the first of its service: a process started by hand runs on
    one device (the first it may use), so a container never has a second one."""
    return bool(svc.spec.group) and world.groups[svc.spec.group][0] is not svc


class _Containers:
    """The services a proxy does not host: each its own always-on process, uncoordinated.

    This is how such a home server runs them (a Whisper or Piper container, ComfyUI,
    Frigate): started with the server, restarted by the supervisor after a crash, each
    serving its own FIFO up to its concurrency, with nobody watching the device's memory
    (the same rules as ``independent``).
    """

    def __init__(self, beside: str) -> None:
        self.beside = beside
        self._seen: set[str] = set()

    def start(self, world: WorldView, ops: WorldOps, hosts: Callable[[ServiceState], bool]) -> None:
        for svc in world.services.values():
            if not hosts(svc) and not _spare_replica(world, svc):
                _load_whole(
                    world,
                    ops,
                    svc,
                    reason=Reason.PRELOAD,
                    detail=f"own process beside {self.beside}",
                )

    def decide(
        self,
        world: WorldView,
        ops: WorldOps,
        requests: list[RequestState],
        hosts: Callable[[ServiceState], bool],
    ) -> None:
        for svc in world.services.values():
            if not hosts(svc) and not _spare_replica(world, svc):
                _restart_crashed(world, ops, svc)
        _serve_own_queues(
            world, ops, requests, self._seen, reason=Reason.UNCOORDINATED, projected=False
        )

    @staticmethod
    def next_wakeup(
        world: WorldView, now: float, hosts: Callable[[ServiceState], bool]
    ) -> list[float]:
        return [
            s.backoff_until
            for s in world.services.values()
            if not hosts(s) and s.status is ServiceStatus.CRASHED and s.backoff_until > now
        ]


class OllamaContainersPolicy:
    """Ollama's scheduler for the models Ollama hosts; everything else its own process.

    Rules, from Ollama's ``server/sched.go`` and ``envconfig/config.go``:

    - One scheduler for all hosted models: pending requests are handled in arrival order
      (a FIFO bounded by ``OLLAMA_MAX_QUEUE``, 512; beyond it a request is refused), one
      model load at a time; a request behind one waiting for a load or an eviction waits.
    - A model loads when its estimate (weights, runtime, KV cache) fits in the device's
      free memory (what the driver reports: other processes included) less
      ``OLLAMA_GPU_OVERHEAD``, and fewer than ``OLLAMA_MAX_LOADED_MODELS`` (3 per GPU by
      default) of Ollama's own models are loaded. Otherwise an idle model is unloaded,
      the one with the shortest keep-alive first (``findRunnerToUnload`` sorts by session
      duration, then name); with nothing of its own left loaded it loads anyway (Ollama
      then offloads layers to the CPU; here the model is loaded whole and the physical
      model decides).
    - Each model runs ``OLLAMA_NUM_PARALLEL`` requests at once (default 1).
    - An idle model unloads after ``keep_alive`` (5 minutes by default); ``-1`` keeps it
      loaded for good: what a user sets for the models the scenario pins. A model kept
      forever is still unloaded to make room when nothing else can be (sorted last).
    - No priorities and no memory reservation per request.
    - Several devices: one runner per model, never two; a model that is not loaded goes
      to the device with the most free memory where it fits whole
      (``pickBestFullFitByLibrary`` sorts the GPUs by free memory, descending, and takes
      the first that fits; with none, the one with the most free memory, where the
      eviction above makes room). A container stays on the device it was given.
    """

    name = "ollama+containers"
    infinite_memory = False
    enforces_budget = False

    def __init__(self, settings: OllamaSettings | None = None) -> None:
        self.settings = settings or OllamaSettings()
        self._seen: set[str] = set()
        self._containers = _Containers("Ollama")

    def hosts(self, svc: ServiceState) -> bool:
        return svc.spec.kind in self.settings.hosted_kinds

    def keep_alive(self, svc: ServiceState) -> float:
        if self.settings.pinned_forever and svc.spec.residency is Residency.PINNED:
            return math.inf
        return self.settings.keep_alive_s

    def start(self, world: WorldView, ops: WorldOps, now: float) -> None:
        self._containers.start(world, ops, self.hosts)

    def route(
        self, world: WorldView, replicas: Sequence[ServiceState], demand: Demand
    ) -> ServiceState:
        up = first_up(replicas)
        if not self.hosts(up) or up.status in (ServiceStatus.LOADED, ServiceStatus.LOADING):
            return up
        by_free = sorted(replicas, key=lambda r: -self._free(world, r.spec.device))
        fits = [r for r in by_free if _resident_whole(r) <= self._free(world, r.spec.device)]
        return (fits or by_free)[0]

    def _free(self, world: WorldView, device: str) -> int:
        dev = world.devices[device]
        used = world.ledger.foreign(device) + world.ledger.committed(device)
        return dev.capacity_bytes - used - self.settings.gpu_overhead_bytes

    def decide(self, world: WorldView, ops: WorldOps, now: float) -> None:
        hosted, others = _split_hosted(world, self.hosts)
        self._containers.decide(world, ops, others, self.hosts)
        for svc in world.services.values():
            if (
                self.hosts(svc)
                and svc.status is ServiceStatus.LOADED
                and svc.idle
                and svc.waiting_count == 0
                and now - svc.last_used >= self.keep_alive(svc)
            ):
                ops.unload(svc, reason=Reason.TTL_EXPIRED, detail="keep_alive expired")
        self._schedule(world, ops, hosted)

    def _schedule(self, world: WorldView, ops: WorldOps, queue: list[RequestState]) -> None:
        blocked = False
        count = 0
        for req in queue:
            if _queue_full(world, ops, req, self._seen, self.settings.max_queue, count):
                continue
            count += 1
            svc = world.services[req.service]
            if _too_large_for_pool(world, ops, req):
                count -= 1
                continue
            if blocked:
                ops.enqueue(req, reason=Reason.LOADING, detail="behind a model load")
                continue
            if svc.status is ServiceStatus.LOADED:
                if len(svc.inflight) >= self.settings.num_parallel:
                    ops.enqueue(
                        req, reason=Reason.CONCURRENCY_LIMIT, detail="OLLAMA_NUM_PARALLEL busy"
                    )
                elif ops.dispatch(req, reason=Reason.UNCOORDINATED, active_bytes=0, enforce=False):
                    count -= 1
                else:
                    ops.enqueue(req, reason=Reason.NO_MEMORY, detail="KV cache full")
            elif svc.status is ServiceStatus.LOADING:
                ops.enqueue(req, reason=Reason.LOADING, detail="model loading")
            elif svc.status is ServiceStatus.UNLOADING:
                ops.enqueue(req, reason=Reason.LOADING, detail="model unloading")
                blocked = True
            elif svc.status is ServiceStatus.CRASHED and world.now < svc.backoff_until:
                ops.enqueue(req, reason=Reason.BACKOFF, detail="runner exited")
                blocked = True
            else:
                blocked = not self._load_for(world, ops, req, svc)

    def _load_for(
        self, world: WorldView, ops: WorldOps, req: RequestState, svc: ServiceState
    ) -> bool:
        """Load ``svc`` now if it may (True); else evict idle models and wait (False)."""
        own = [s for s in world.services.values() if self.hosts(s)]
        if any(s.status is ServiceStatus.LOADING for s in own):
            ops.enqueue(req, reason=Reason.LOADING, detail="one model load at a time")
            return False
        dev = svc.spec.device
        cap = self.settings.max_loaded_models
        need = _resident_whole(svc)
        loaded = [s for s in own if s.spec.device == dev and s.holds_memory]
        free = self._free(world, dev)
        if not loaded or ((cap is None or len(loaded) < cap) and need <= free):
            _load_whole(world, ops, svc, reason=Reason.DEMAND, detail=f"for {req.request_id}")
            ops.enqueue(req, reason=Reason.LOADING, detail="cold start")
            return True
        if any(s.status is ServiceStatus.UNLOADING for s in loaded):
            ops.enqueue(req, reason=Reason.NO_MEMORY, detail="waiting for an unload")
            return False
        idle = [s for s in loaded if s.status is ServiceStatus.LOADED and s.idle]
        idle.sort(key=lambda s: (self.keep_alive(s), s.name))
        count = len(loaded)
        for victim in idle:
            if (cap is None or count < cap) and need <= free:
                break
            ops.unload(victim, reason=Reason.EVICTED_FOR_MEMORY, detail=f"for {svc.name}")
            free += victim.resident_bytes
            count -= 1
        ops.enqueue(req, reason=Reason.NO_MEMORY, detail="waiting for room")
        return False

    def next_wakeup(self, world: WorldView, now: float) -> float | None:
        times = [
            s.last_used + self.keep_alive(s)
            for s in world.services.values()
            if self.hosts(s) and s.status is ServiceStatus.LOADED and s.idle
        ]
        times += [
            s.backoff_until
            for s in world.services.values()
            if self.hosts(s) and s.status is ServiceStatus.CRASHED
        ]
        times += self._containers.next_wakeup(world, now, self.hosts)
        return _earliest_after([t for t in times if math.isfinite(t)], now)


#: llama-swap's implicit group of every model in no group (``proxy/config.go``: swap and
#: exclusive both true).
DEFAULT_SWAP_GROUP = SwapGroup(name="(default)", members=(), swap=True, exclusive=True)


def member_matches(selector: str, spec: ServiceSpec) -> bool:
    """A group member: a service name, ``*``, or ``residency:``/``class:``/``kind:`` VALUE."""
    if selector == "*":
        return True
    key, sep, value = selector.partition(":")
    if not sep:
        return spec.name == selector
    if key == "residency":
        return spec.residency.value == value
    if key == "class":
        return spec.cls.label == value
    if key == "kind":
        return spec.kind.value == value
    return False


def resolve_groups(
    services: list[ServiceSpec], groups: tuple[SwapGroup, ...]
) -> dict[str, SwapGroup]:
    """Each service -> its group: the first whose members match it, else the default group."""
    out: dict[str, SwapGroup] = {}
    for spec in services:
        out[spec.name] = next(
            (g for g in groups if any(member_matches(m, spec) for m in g.members)),
            DEFAULT_SWAP_GROUP,
        )
    return out


class LlamaSwapPolicy:
    """llama-swap with groups as its README recommends; other services run beside it.

    Rules, from llama-swap's README, ``config.example.yaml`` and ``proxy/`` (process
    groups):

    - Each model belongs to one group; models in no group form the default group
      (``swap: true, exclusive: true``).
    - ``swap: true``: one model of the group runs at a time. The group serves requests
      in arrival order; a request for another model waits until the running model's
      requests finish, then that model is stopped and the requested one started.
      ``swap: false``: every member may run at once, each started on its first request.
    - ``exclusive: true``: starting a model stops the models of every other group that
      is not ``persistent`` (after their requests finish).
    - ``persistent: true``: other groups never stop this group's models; with
      ``hooks.on_startup.preload`` they start with the server.
    - ``ttl``: a model idle this long stops (0: never). Here each service's own
      ``ttl_s``; never for pinned services.
    - No memory accounting and no request queue limit: a request waits until its
      client gives up (the deadline). Each model runs its own concurrency (llama-server
      ``-np``).

    The default layout is the README's: the pinned (voice) services in a persistent,
    non-swapping group and everything else llama-swap proxies in one swap group.
    """

    name = "llama-swap"
    infinite_memory = False
    enforces_budget = False

    def __init__(self, settings: LlamaSwapSettings | None = None) -> None:
        self.settings = settings or LlamaSwapSettings()
        self.group_of: dict[str, SwapGroup] = {}
        self._containers = _Containers("llama-swap")

    def hosts(self, svc: ServiceState) -> bool:
        return svc.spec.kind in self.settings.hosted_kinds

    def ttl(self, svc: ServiceState) -> float:
        if not self.settings.use_ttl or svc.spec.residency is Residency.PINNED:
            return 0.0
        return svc.spec.ttl_s

    def _groups(self, world: WorldView) -> dict[str, SwapGroup]:
        if not self.group_of:
            hosted = [s.spec for s in world.services.values() if self.hosts(s)]
            self.group_of = resolve_groups(hosted, self.settings.groups)
        return self.group_of

    def start(self, world: WorldView, ops: WorldOps, now: float) -> None:
        self._containers.start(world, ops, self.hosts)
        for name, group in self._groups(world).items():
            if group.persistent and self.settings.preload_persistent:
                svc = world.services[name]
                _load_whole(
                    world, ops, svc, reason=Reason.PRELOAD, detail="hooks.on_startup.preload"
                )

    def decide(self, world: WorldView, ops: WorldOps, now: float) -> None:
        group_of = self._groups(world)
        hosted, others = _split_hosted(world, self.hosts)
        self._containers.decide(world, ops, others, self.hosts)
        by_group: dict[str, list[RequestState]] = {}
        for req in hosted:
            if not _too_large_for_pool(world, ops, req):
                by_group.setdefault(group_of[req.service].name, []).append(req)
        groups = {g.name: g for g in group_of.values()}
        for gname, reqs in by_group.items():
            group = groups[gname]
            if group.swap:
                self._serve_swapping(world, ops, group, reqs)
            else:
                self._serve_together(world, ops, group, reqs)
        for svc in world.services.values():
            ttl = self.ttl(svc) if self.hosts(svc) else 0.0
            if (
                ttl > 0
                and svc.status is ServiceStatus.LOADED
                and svc.idle
                and svc.waiting_count == 0
                and now - svc.last_used >= ttl
            ):
                ops.unload(svc, reason=Reason.TTL_EXPIRED, detail="ttl")

    def _members(self, world: WorldView, group: SwapGroup) -> list[ServiceState]:
        return [world.services[n] for n, g in self._groups(world).items() if g == group]

    def _others_cleared(
        self, world: WorldView, ops: WorldOps, group: SwapGroup, svc: ServiceState
    ) -> bool:
        """For an exclusive group: stop every other non-persistent group's models first."""
        if not group.exclusive:
            return True
        clear = True
        for name, other in self._groups(world).items():
            peer = world.services[name]
            if other == group or other.persistent or not peer.holds_memory:
                continue
            clear = False
            if peer.status is ServiceStatus.LOADED and peer.idle:
                ops.unload(peer, reason=Reason.SWAP, detail=f"exclusive group for {svc.name}")
        return clear

    def _start(self, world: WorldView, ops: WorldOps, group: SwapGroup, req: RequestState) -> bool:
        """Start ``req``'s model when its group's rules let it (True); the request waits."""
        svc = world.services[req.service]
        if svc.status is ServiceStatus.CRASHED and world.now < svc.backoff_until:
            ops.enqueue(req, reason=Reason.BACKOFF, detail="process exited")
            return False
        if not self._others_cleared(world, ops, group, svc):
            ops.enqueue(req, reason=Reason.LOADING, detail="other groups stopping")
            return False
        _load_whole(world, ops, svc, reason=Reason.SWAP, detail=f"start for {req.request_id}")
        ops.enqueue(req, reason=Reason.LOADING, detail="starting")
        return True

    @staticmethod
    def _serve(world: WorldView, ops: WorldOps, req: RequestState, svc: ServiceState) -> None:
        if svc.status is not ServiceStatus.LOADED:
            ops.enqueue(req, reason=Reason.LOADING, detail=svc.status.value)
        elif len(svc.inflight) >= svc.spec.concurrency:
            ops.enqueue(req, reason=Reason.CONCURRENCY_LIMIT, detail="all slots busy")
        elif not ops.dispatch(req, reason=Reason.UNCOORDINATED, active_bytes=0, enforce=False):
            ops.enqueue(req, reason=Reason.NO_MEMORY, detail="KV cache full")

    def _serve_swapping(
        self, world: WorldView, ops: WorldOps, group: SwapGroup, reqs: list[RequestState]
    ) -> None:
        resident = [s for s in self._members(world, group) if s.holds_memory]
        current = resident[0] if resident else None
        for req in reqs:
            svc = world.services[req.service]
            if current is None:
                if not self._start(world, ops, group, req):
                    return
                current = svc
                continue
            if svc is not current:
                if current.status is ServiceStatus.LOADED and current.idle:
                    ops.unload(current, reason=Reason.SWAP, detail=f"swap to {svc.name}")
                ops.enqueue(req, reason=Reason.LOADING, detail=f"waits for {current.name}")
                return
            self._serve(world, ops, req, svc)

    def _serve_together(
        self, world: WorldView, ops: WorldOps, group: SwapGroup, reqs: list[RequestState]
    ) -> None:
        for req in reqs:
            svc = world.services[req.service]
            if svc.status in (ServiceStatus.UNLOADED, ServiceStatus.CRASHED):
                self._start(world, ops, group, req)
            else:
                self._serve(world, ops, req, svc)

    def next_wakeup(self, world: WorldView, now: float) -> float | None:
        times = [
            s.last_used + self.ttl(s)
            for s in world.services.values()
            if self.hosts(s) and s.status is ServiceStatus.LOADED and s.idle and self.ttl(s) > 0
        ]
        times += [
            s.backoff_until
            for s in world.services.values()
            if self.hosts(s) and s.status is ServiceStatus.CRASHED
        ]
        times += self._containers.next_wakeup(world, now, self.hosts)
        return _earliest_after(times, now)


class OraclePolicy(_WarmPerServicePolicy):
    """Infinite memory, everything warm: the upper bound on what any policy can reach."""

    name = "oracle"
    infinite_memory = True
    enforces_budget = False
    preload_detail = "all warm"
    projected = True
    dispatch_reason = Reason.FITS

    def route(
        self, world: WorldView, replicas: Sequence[ServiceState], demand: Demand
    ) -> ServiceState:
        """Every replica is loaded: the one with the fewest requests per slot."""
        return min(
            replicas,
            key=lambda r: ((len(r.inflight) + r.waiting_count) / r.spec.concurrency, r.index),
        )


def _knobs(settings: BaselineSettings | None) -> BaselineSettings:
    return settings if settings is not None else BaselineSettings()


#: Each baseline's factory, as the policy registry takes it (``register_baselines``).
BASELINES: dict[str, Callable[[BaselineSettings | None], Policy]] = {
    "independent": lambda _: IndependentPolicy(),
    "static": lambda _: StaticPolicy(),
    "ollama+containers": lambda s: OllamaContainersPolicy(_knobs(s).ollama),
    "llama-swap": lambda s: LlamaSwapPolicy(_knobs(s).llama_swap),
    "oracle": lambda _: OraclePolicy(),
}
