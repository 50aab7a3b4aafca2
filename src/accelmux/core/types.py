"""Small shared vocabulary of the core: classes, residency, states, reasons."""

from __future__ import annotations

from enum import IntEnum, StrEnum

GIB = 1024**3
MIB = 1024**2


def require(condition: bool, message: str) -> None:
    """Raise ValueError(``message``) unless ``condition``: the checks of the core's records."""
    if not condition:
        raise ValueError(message)


class ServiceClass(IntEnum):
    """Priority class. A lower value is more important."""

    REALTIME = 0
    INTERACTIVE = 1
    BATCH = 2
    BACKGROUND = 3

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> ServiceClass:
        return cls[text.upper()]


class Residency(StrEnum):
    PINNED = "pinned"
    WARM = "warm"
    ON_DEMAND = "on-demand"


class ServiceKind(StrEnum):
    CHAT = "chat"
    COMPLETION = "completion"
    EMBEDDINGS = "embeddings"
    IMAGE = "image"
    ASR = "asr"
    TTS = "tts"
    DETECT = "detect"
    CAMERA = "camera"

    @property
    def is_llm(self) -> bool:
        return self in (ServiceKind.CHAT, ServiceKind.COMPLETION)


class ResizeSupport(StrEnum):
    """When a backend can change a service's KV pool.

    ``live``: while it runs (the change is acknowledged by the backend). ``next_load``:
    only by starting it again with the new size (a server's ``--ctx-size``). ``none``:
    never; the pool is what the backend was configured with (the profile's ceiling).
    """

    LIVE = "live"
    NEXT_LOAD = "next_load"
    NONE = "none"


class Tier(StrEnum):
    """Where a service's weights are while it is not loaded on its device.

    ``cold``: on disk only; a load reads them at the device's ``load_bandwidth``.
    ``parked``: in host RAM (the page cache of an mmap'd GGUF file, kept there by the
    backend); a load copies them at the device's ``host_bandwidth``. ``sleeping``: the
    backend's process stays up with its weights in host RAM (vLLM's sleep mode, level
    1); a wake copies them back at ``host_bandwidth`` and skips the start-up. Parked and
    sleeping weights are charged to the host budget.
    """

    COLD = "cold"
    PARKED = "parked"
    SLEEPING = "sleeping"


class ServiceStatus(StrEnum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    UNLOADING = "unloading"
    CRASHED = "crashed"


class Category(StrEnum):
    """Ledger categories, per device and service (headroom and foreign per device)."""

    WEIGHTS = "weights"
    RUNTIME = "runtime"
    KV = "kv"
    ACTIVE = "active"
    RESERVED = "reserved"
    #: Measured memory of a service that is not loaded (a sleeping server's process, a
    #: worker still holding what it freed late): charged until a sample shows it gone.
    LEFTOVER = "leftover"
    HEADROOM = "headroom"
    FOREIGN = "foreign"
    #: Per device: host RAM the park budget holds (parked or sleeping weights, parked KV
    #: state) on the device whose memory is that RAM (kind ``host``).
    PARKED = "parked"


SERVICE_CATEGORIES: tuple[Category, ...] = (
    Category.WEIGHTS,
    Category.RUNTIME,
    Category.KV,
    Category.ACTIVE,
    Category.RESERVED,
    Category.LEFTOVER,
)

#: Service categories set from measurements (not leased): reserved and leftover.
MEASURED_CATEGORIES: tuple[Category, ...] = (Category.RESERVED, Category.LEFTOVER)


class Reason(StrEnum):
    """Machine-readable reason carried by every action."""

    # dispatch
    FITS = "fits"
    FITS_AFTER_EVICTION = "fits_after_eviction"
    FITS_AFTER_SHRINK = "fits_after_shrink"
    FITS_AFTER_PREEMPTION = "fits_after_preemption"
    UNCOORDINATED = "uncoordinated"
    # enqueue / wait
    LOADING = "loading"
    NO_MEMORY = "no_memory"
    CONCURRENCY_LIMIT = "concurrency_limit"
    RESIZING = "resizing"
    PAUSED = "paused"
    HIGHER_CLASS_WAITING = "higher_class_waiting"
    OUTSIDE_WINDOW = "outside_window"
    BACKOFF = "backoff"
    # reject
    QUEUE_FULL = "queue_full"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    TOO_LARGE = "too_large"
    SERVICE_UNAVAILABLE = "service_unavailable"
    LOAD_FAILED = "load_failed"
    BACKEND_CRASHED = "backend_crashed"
    CANCELLED = "cancelled"
    SHUTTING_DOWN = "shutting_down"
    # load / unload
    DEMAND = "demand"
    PINNED = "pinned"
    PRELOAD = "preload"
    ADMIN = "admin"
    RELOAD_AFTER_CRASH = "reload_after_crash"
    TTL_EXPIRED = "ttl_expired"
    EVICTED_FOR_MEMORY = "evicted_for_memory"
    SWAP = "swap"
    FOREIGN_PRESSURE = "foreign_pressure"
    WINDOW_OPEN = "window_open"
    RESIZE_AT_NEXT_LOAD = "resize_at_next_load"
    HOST_BUDGET = "host_budget"
    #: A lesser form of a service (fewer layers on its GPU, or on the CPU) loads: its
    #: full form cannot be held without evicting a higher class (see core/degrade.py).
    DEGRADED = "degraded"
    #: A better form of a degraded service loads: room for it returned.
    ROOM_RETURNED = "room_returned"
    #: A lesser form unloads: a better form of its service is loaded and serves.
    SUPERSEDED = "superseded"
    #: A request of a batch service runs at a smaller batch (less activation memory at
    #: a time, more passes): its full batch cannot be held without evicting a higher
    #: class or stopping work (see core/shrink.py).
    BATCH_SHRUNK = "batch_shrunk"
    #: A shrunk batch service runs a larger batch again: free memory holds it.
    BATCH_GROWN = "batch_grown"
    # resize
    BALLOON_GROW = "balloon_grow"
    BALLOON_SHRINK = "balloon_shrink"
    # preempt
    PREEMPTED_FOR_HIGHER_CLASS = "preempted_for_higher_class"
    OVER_ESTIMATE = "over_estimate"
    WINDOW_CLOSED = "window_closed"
    # pause / resume (token-level time sharing)
    TIME_SHARE = "time_share"
    RESUMED = "resumed"
