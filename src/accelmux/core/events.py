"""Inputs of the Manager. Frozen, slotted, keyword-only, validated when built."""

from __future__ import annotations

from dataclasses import dataclass, field

from accelmux.core.types import Reason, require


def _require_oom_figures(asked_bytes: int | None, device_used_bytes: int | None) -> None:
    """What an out-of-memory failure reports (either may be unmeasured) is not negative."""
    require(asked_bytes is None or asked_bytes >= 0, "asked_bytes must be >= 0")
    require(device_used_bytes is None or device_used_bytes >= 0, "device_used_bytes must be >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class Demand:
    """What one request asks of its service.

    ``kv_tokens``: tokens of KV state the request may hold (prompt + max output) for LLMs.
    ``units``: the kind-specific size that drives activation memory and service time:
    megapixels for image and detection, seconds of audio for ASR, characters for TTS,
    number of texts for embeddings.
    ``prompt_tokens`` and ``output_tokens`` drive the service-time model of LLMs.
    """

    kv_tokens: int = 0
    units: float = 0.0
    prompt_tokens: int = 0
    output_tokens: int = 0

    def __post_init__(self) -> None:
        require(self.kv_tokens >= 0, "kv_tokens must be >= 0")
        require(self.units >= 0, "units must be >= 0")
        require(self.prompt_tokens >= 0 and self.output_tokens >= 0, "tokens must be >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestArrived:
    """A request for ``service``.

    ``keep_alive_s`` is the client's wish for how long the service stays loaded once
    idle (Ollama's ``keep_alive``; ``math.inf``: until memory is needed, ``0``: unload
    when idle). It replaces the service's ``ttl_s`` until the next request says
    otherwise; ``None`` (every OpenAI request) restores ``ttl_s``. It is ignored, and
    not remembered, while the operator keeps the service (pinned or loaded).
    """

    request_id: str
    service: str
    demand: Demand = field(default_factory=Demand)
    job_id: str | None = None
    keep_alive_s: float | None = None
    #: The request's answer is streamed, so its backend can pause it between tokens
    #: (when it declares ``pause``): only such a request is ever paused.
    pausable: bool = False

    def __post_init__(self) -> None:
        require(bool(self.request_id), "request_id must not be empty")
        require(bool(self.service), "service must not be empty")
        require(self.keep_alive_s is None or self.keep_alive_s >= 0, "keep_alive_s must be >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestFinished:
    """A dispatched request ended. ``attempt`` matches the Dispatch it answers."""

    request_id: str
    attempt: int
    ok: bool = True
    peak_bytes: int | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        require(self.attempt >= 1, "attempt starts at 1")
        require(self.peak_bytes is None or self.peak_bytes >= 0, "peak_bytes must be >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestCancelled:
    """The client went away before the request ended."""

    request_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadFinished:
    """A Load completed. Measured sizes, when known, calibrate the profile."""

    service: str
    weights_bytes: int | None = None
    runtime_bytes: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadFailed:
    """A Load did not complete. ``out_of_memory``: it ran out of device memory (the
    service is larger than the ledger thought, or the device fuller).

    What the shell measured of an out-of-memory load, when it could (None: not known):
    ``asked_bytes``, the resident bytes the load tried to hold; ``device_used_bytes``,
    what the device held besides it when it failed. The Manager attributes the failure
    from them (:mod:`accelmux.core.oom`) before anything is learned.
    """

    service: str
    error: str
    out_of_memory: bool = False
    asked_bytes: int | None = None
    device_used_bytes: int | None = None

    def __post_init__(self) -> None:
        _require_oom_figures(self.asked_bytes, self.device_used_bytes)


@dataclass(frozen=True, slots=True, kw_only=True)
class ResizeFinished:
    """The backend answered a Resize: ``ok`` when the pool is ``kv_pool_bytes`` now.

    Until this event the ledger counts the larger of the old and the new pool, and
    requests are admitted only into the smaller.
    """

    service: str
    kv_pool_bytes: int
    ok: bool = True
    error: str | None = None

    def __post_init__(self) -> None:
        require(self.kv_pool_bytes >= 0, "kv_pool_bytes must be >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class PauseFinished:
    """The backend paused the request (``attempt``) between tokens as a ``Pause`` asked:
    its stream is stopped and, for ``park``, its KV state is off the device. Until this
    event the request counts as running and keeps every byte it holds."""

    request_id: str
    attempt: int

    def __post_init__(self) -> None:
        require(self.attempt >= 1, "attempt starts at 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class PauseRefused:
    """The backend could not pause the request (``attempt``): it runs on, holding what
    it held, and is not asked to pause again (``error`` says why)."""

    request_id: str
    attempt: int
    error: str = ""

    def __post_init__(self) -> None:
        require(self.attempt >= 1, "attempt starts at 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class Unloaded:
    service: str


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendCrashed:
    """A service's backend died. ``out_of_memory``: a request's allocation failed
    (``request_id``, when known; ``asked_bytes``, the activation it tried to hold;
    ``device_used_bytes``, what the device held besides it), so the Manager can attribute
    the failure before anything is learned (:mod:`accelmux.core.oom`)."""

    service: str
    error: str
    reason: Reason = Reason.BACKEND_CRASHED
    out_of_memory: bool = False
    request_id: str | None = None
    asked_bytes: int | None = None
    device_used_bytes: int | None = None

    def __post_init__(self) -> None:
        _require_oom_figures(self.asked_bytes, self.device_used_bytes)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemorySampled:
    """A measurement of one device.

    ``used_bytes``: device-wide used memory. ``per_service``: measured bytes of each
    managed service (process memory, or NVML per-process). Foreign usage is derived:
    used - sum(per_service) - ``baseline_bytes`` (memory the device uses on its own,
    for the host device the OS and accelmux itself) - ``overhead_bytes``.

    ``overhead_bytes``: memory accelmux's inference workers hold on the device beyond
    what they attribute to their services (a CUDA context, allocator slack). It is in
    use (the ledger counts it against what is available), never foreign.
    """

    device: str
    used_bytes: int
    per_service: dict[str, int] = field(default_factory=dict)
    baseline_bytes: int = 0
    overhead_bytes: int = 0

    def __post_init__(self) -> None:
        require(self.used_bytes >= 0, "used_bytes must be >= 0")
        require(all(v >= 0 for v in self.per_service.values()), "per_service must be >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminCommand:
    """An operator's order: load, unload, pin or unpin a service."""

    service: str
    op: str

    def __post_init__(self) -> None:
        require(self.op in ("load", "unload", "pin", "unpin"), f"unknown admin op {self.op!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Tick:
    """Time passed: deadlines, TTLs, windows and backoffs are checked."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ShutdownRequested:
    """Stop admitting; waiting requests are rejected."""


Event = (
    RequestArrived
    | RequestFinished
    | RequestCancelled
    | LoadFinished
    | LoadFailed
    | ResizeFinished
    | PauseFinished
    | PauseRefused
    | Unloaded
    | BackendCrashed
    | MemorySampled
    | AdminCommand
    | Tick
    | ShutdownRequested
)
