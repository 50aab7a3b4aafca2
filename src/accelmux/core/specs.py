"""Static descriptions the Manager is built from: devices, services, policy knobs.

These are plain frozen dataclasses; ``accelmux.config`` builds them from YAML.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from accelmux.core.degrade import Variant
from accelmux.core.shrink import BatchShrink
from accelmux.core.switches import Switches, unknown_switch_message, unknown_switches
from accelmux.core.types import Residency, ResizeSupport, ServiceClass, ServiceKind, require

DAY_S = 86_400.0


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceSpec:
    """One pool of accelerator memory."""

    name: str
    kind: str  # "nvidia" | "host" | "virtual"
    capacity_bytes: int
    budget_bytes: int
    headroom_bytes: int
    load_bandwidth_bps: float = 2e9  # bytes/s from disk or page cache into the device
    #: bytes/s from host RAM into the device: a parked or sleeping service's reload
    host_bandwidth_bps: float = 12e9

    def __post_init__(self) -> None:
        require(self.capacity_bytes > 0, f"device {self.name}: capacity must be > 0")
        require(
            0 < self.budget_bytes <= self.capacity_bytes,
            f"device {self.name}: budget must be in (0, capacity]",
        )
        require(
            0 <= self.headroom_bytes < self.budget_bytes,
            f"device {self.name}: headroom must be in [0, budget)",
        )
        require(self.load_bandwidth_bps > 0, f"device {self.name}: bandwidth must be > 0")
        require(self.host_bandwidth_bps > 0, f"device {self.name}: host bandwidth must be > 0")

    @property
    def usable_bytes(self) -> int:
        """What the manager may commit before foreign memory: budget - headroom."""
        return self.budget_bytes - self.headroom_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryProfile:
    """What a service costs.

    Resident: ``weights`` + ``runtime`` (+ the KV pool for LLMs, between ``kv_floor``
    and ``kv_ceiling``). Per request: ``kv_bytes_per_token`` x kv tokens (drawn from the
    KV pool) and ``workspace`` + ``per_unit`` x units of activation memory (``active``).
    """

    weights: int
    runtime: int = 0
    kv_bytes_per_token: int = 0
    kv_floor: int = 0
    kv_ceiling: int = 0
    workspace: int = 0
    per_unit: float = 0.0

    def __post_init__(self) -> None:
        require(self.weights >= 0 and self.runtime >= 0, "weights/runtime must be >= 0")
        require(self.kv_bytes_per_token >= 0, "kv_bytes_per_token must be >= 0")
        require(0 <= self.kv_floor <= self.kv_ceiling, "need 0 <= kv_floor <= kv_ceiling")
        require(self.workspace >= 0 and self.per_unit >= 0, "workspace/per_unit must be >= 0")

    @property
    def resident_floor(self) -> int:
        return self.weights + self.runtime + self.kv_floor

    @property
    def elastic(self) -> bool:
        return self.kv_ceiling > self.kv_floor


@dataclass(frozen=True, slots=True, kw_only=True)
class Window:
    """A daily maintenance window, in seconds since local midnight; may wrap midnight."""

    start_s: float
    end_s: float

    def __post_init__(self) -> None:
        require(0 <= self.start_s < DAY_S and 0 <= self.end_s <= DAY_S, "window out of day")
        require(self.start_s != self.end_s, "window must not be empty")

    def contains(self, time_of_day_s: float) -> bool:
        t = time_of_day_s % DAY_S
        if self.start_s < self.end_s:
            return self.start_s <= t < self.end_s
        return t >= self.start_s or t < self.end_s

    def seconds_until_edge(self, time_of_day_s: float) -> float:
        """Seconds until the window next opens or closes (always > 0)."""
        return seconds_until_next(self.edges, time_of_day_s)

    @property
    def edges(self) -> tuple[float, float]:
        """When it opens and when it closes, in seconds since midnight (< a day)."""
        return (self.start_s, self.end_s % DAY_S)


def seconds_until_next(edges: Iterable[float], time_of_day_s: float) -> float:
    """Seconds until the next of ``edges`` (seconds since midnight) after the time of day
    (always > 0; a day when no edge is ahead, or there is none)."""
    t = time_of_day_s % DAY_S
    best = DAY_S
    for edge in edges:
        delta = (edge - t) % DAY_S
        if delta > 0:
            best = min(best, delta)
    return best


def seconds_until_next_sorted(edges: Sequence[float], time_of_day_s: float) -> float:
    """:func:`seconds_until_next` of ``edges`` sorted and each within a day (window
    edges are), found by bisection: the same value, from the same arithmetic."""
    t = time_of_day_s % DAY_S
    later = bisect.bisect_right(edges, t)
    if later < len(edges):
        return edges[later] - t  # the nearest edge ahead (later ones are further)
    if edges and edges[0] < t:
        return (edges[0] - t) % DAY_S  # none ahead today: the first one tomorrow
    return DAY_S


@dataclass(frozen=True, slots=True, kw_only=True)
class Capabilities:
    """What a service's backend declares it can do; the core uses nothing else.

    ``resize``: when the KV pool can change (see :class:`ResizeSupport`). ``pause``: a
    running request can be paused between tokens and resumed with no lost or repeated
    output; ``park``: a paused request's KV state can leave the device (saved to host
    RAM) and be restored instead of recomputing its prompt; ``sleep``: the loaded model
    can be put to sleep (its weights go to host RAM, the process stays: tier
    ``sleeping``); ``host_cache``: an unloaded model's weights can be kept in host RAM
    (the page cache of an mmap'd file) and reloaded from there (tier ``parked``).
    ``request_peaks``: finished requests report their measured peak memory, which
    calibrates the service's estimates. ``park_on_disk``: parked KV state goes to files
    on disk (llama-server's slot save), not host RAM: it is not charged to the host
    budget. ``kv_per_slot``: the backend splits its KV pool evenly between its
    ``concurrency`` slots (llama-server's ``--parallel``): one request can use at most
    one slot's share of it.

    The default is the simulator's model of a backend: a live resize and measured
    peaks, nothing else.
    """

    resize: ResizeSupport = ResizeSupport.LIVE
    pause: bool = False
    park: bool = False
    sleep: bool = False
    host_cache: bool = False
    request_peaks: bool = True
    park_on_disk: bool = False
    kv_per_slot: bool = False

    def as_dict(self) -> dict[str, object]:
        return {
            "resize": self.resize.value,
            "pause": self.pause,
            "park": self.park,
            "sleep": self.sleep,
            "host_cache": self.host_cache,
            "request_peaks": self.request_peaks,
            "park_on_disk": self.park_on_disk,
            "kv_per_slot": self.kv_per_slot,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceSpec:
    name: str
    kind: ServiceKind
    cls: ServiceClass
    residency: Residency
    device: str
    profile: MemoryProfile
    concurrency: int = 1
    ttl_s: float = 300.0
    init_s: float = 1.0
    queue_limit: int = 32
    deadline_s: float = 30.0
    windows: tuple[Window, ...] = ()
    model: str = ""
    capabilities: Capabilities = field(default_factory=Capabilities)
    #: The service clients address when this spec is one replica of a service that may
    #: run on several devices (``chat@gpu1`` of ``chat``); "" when it is the service.
    group: str = ""
    #: Services on one device with the same non-empty key hold one copy of their weights
    #: (one model loaded once in the shared inference worker): the ledger charges it once.
    weights_key: str = ""
    #: A steady stream of work at a frame rate (a camera's frames): batch work may not
    #: evict it nor stop its requests, so a maintenance window never costs a camera its
    #: frames (the background floor). Higher classes still may. It ranks above batch when
    #: room is made (:func:`room_rank`).
    steady: bool = False
    #: One form of a service that may degrade (a replica of its group: see
    #: :mod:`accelmux.core.degrade`); None for every other service.
    variant: Variant | None = None
    #: How small its batch and parallelism may get under memory pressure (see
    #: :mod:`accelmux.core.shrink`); None: it always runs its full batch.
    shrink: BatchShrink | None = None
    #: The latency its requests are meant to meet (its SLO: the time to first token of an
    #: LLM, else the whole request's), None when none is set. One decision reads it: a
    #: pinned service yields to a realtime request only when its reload keeps its own
    #: objective (``Room.unpins``).
    objective_s: float | None = None

    def __post_init__(self) -> None:
        require(self.concurrency >= 1, f"service {self.name}: concurrency must be >= 1")
        require(self.ttl_s >= 0, f"service {self.name}: ttl must be >= 0")
        require(self.queue_limit >= 0, f"service {self.name}: queue_limit must be >= 0")
        require(self.deadline_s > 0, f"service {self.name}: deadline must be > 0")
        require(self.init_s >= 0, f"service {self.name}: init_s must be >= 0")
        require(
            self.objective_s is None or self.objective_s > 0,
            f"service {self.name}: objective_s must be > 0",
        )

    @property
    def addressed_as(self) -> str:
        """The name requests use: the group of a replica, else the service's own name."""
        return self.group or self.name

    def in_window(self, time_of_day_s: float) -> bool:
        """True when the service has no windows or one of them is open."""
        return not self.windows or any(w.contains(time_of_day_s) for w in self.windows)


def floored(spec: ServiceSpec, cls: ServiceClass) -> bool:
    """Whether work of class ``cls`` may not take ``spec``'s memory nor stop its requests:
    batch and background work never take a steady service (the background floor)."""
    return spec.steady and cls >= ServiceClass.BATCH


def room_rank(cls: ServiceClass, *, steady: bool) -> int:
    """Where work of class ``cls`` (of a steady service when ``steady``) stands when room
    is made on a device, lower first: realtime 0, interactive 1, a steady service's batch
    or background work 2, batch 3, other background 4.

    A steady service ranks above batch for room-making: its memory, lost to an
    out-of-memory crash or an eviction, comes back from batch work (idle batch services
    are evicted, running batch work stopped), as batch work may not take a steady
    service's (:func:`floored`). Without steady services the order is the classes'."""
    return _RANKS[cls, steady]


def _rank(cls: ServiceClass, steady: bool) -> int:
    if steady and cls >= ServiceClass.BATCH:
        return 2
    return int(cls) if cls < ServiceClass.BATCH else int(cls) + 1


#: :func:`room_rank` of every class, steady or not (asked for every service surveyed).
_RANKS: dict[tuple[ServiceClass, bool], int] = {
    (c, s): _rank(c, s) for c in ServiceClass for s in (False, True)
}


def ranks_below(spec: ServiceSpec, cls: ServiceClass, *, steady: bool) -> bool:
    """Whether ``spec``'s work ranks strictly below work of class ``cls`` (of a steady
    service when ``steady``) when room is made (:func:`room_rank`)."""
    return room_rank(spec.cls, steady=spec.steady) > room_rank(cls, steady=steady)


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyKnobs:
    """Tunables of the accelmux policy (baselines read the few they need)."""

    safety_factor: float = 1.2
    calibration_window: int = 64
    on_demand_ttl_s: float = 30.0
    reuse_horizon_s: float = 600.0
    spare_fraction: float = 0.25
    crash_backoff_s: float = 1.0
    crash_backoff_max_s: float = 60.0
    balloon_idle_s: float = 30.0
    #: After a realtime request ends, batch and background work stay held this long on its
    #: device: the next step of a voice chain (ASR -> chat -> TTS) follows within it.
    #: None: the policy's own (``host_realtime_grace_s`` on a host device, none on a
    #: discrete accelerator).
    realtime_grace_s: float | None = None
    #: A batch request that has waited this share of its queue deadline ages: room for
    #: it may then evict idle interactive models. None (the default): no request ages
    #: (docs/architecture.md, "Batch ageing, opt-in").
    batch_age_fraction: float | None = None
    class_weights: tuple[float, float, float, float] = (16.0, 4.0, 1.0, 1.0)
    prewarm: bool = True
    max_decision_log: int = 2000
    #: Names of accelmux policy heuristics turned off (ablation): each one a
    #: :class:`~accelmux.core.switches.Switch`. Baselines ignore it.
    disabled: frozenset[str] = frozenset()
    #: ``disabled`` as a record of booleans, one per switch (built once, here).
    switches: Switches = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        require(self.safety_factor >= 1.0, "safety_factor must be >= 1")
        require(self.calibration_window >= 1, "calibration_window must be >= 1")
        require(0 <= self.spare_fraction < 1, "spare_fraction must be in [0, 1)")
        require(
            self.realtime_grace_s is None or self.realtime_grace_s >= 0,
            "realtime_grace_s must be >= 0",
        )
        require(
            self.batch_age_fraction is None or 0 < self.batch_age_fraction <= 1,
            "batch_age_fraction must be in (0, 1]",
        )
        unknown = unknown_switches(sorted(self.disabled))
        require(not unknown, f"disabled: {unknown_switch_message(unknown)}")
        object.__setattr__(self, "switches", Switches.from_disabled(self.disabled))


@dataclass(frozen=True, slots=True, kw_only=True)
class ManagerSpec:
    devices: tuple[DeviceSpec, ...]
    services: tuple[ServiceSpec, ...]
    knobs: PolicyKnobs = field(default_factory=PolicyKnobs)
    clock_origin_s_of_day: float = 0.0
    #: Host RAM the ledger may fill with parked or sleeping weights and parked KV state
    #: (0: no parking; every unload is cold).
    host_budget_bytes: int = 0

    def __post_init__(self) -> None:
        names = [d.name for d in self.devices]
        require(len(set(names)) == len(names), "device names must be unique")
        require(self.host_budget_bytes >= 0, "host budget must be >= 0")
        snames = [s.name for s in self.services]
        require(len(set(snames)) == len(snames), "service names must be unique")
        for s in self.services:
            require(s.device in names, f"service {s.name}: unknown device {s.device!r}")
            require(
                not s.group or s.group not in snames,
                f"service {s.name}: its group {s.group!r} is also a service's name",
            )
        forms: dict[str, list[int]] = {}
        for s in self.services:
            if s.variant is not None:
                require(bool(s.group), f"service {s.name}: a form of a service needs a group")
                forms.setdefault(s.group, []).append(s.variant.rank)
        for group, ranks in forms.items():
            members = sum(1 for s in self.services if s.group == group)
            require(
                sorted(ranks) == list(range(len(ranks))) and len(ranks) == members,
                f"service {group}: its forms must be ranked 0, 1, ... with nothing else beside",
            )
