"""Outputs of the Manager. Every action carries a machine-readable ``reason``."""

from __future__ import annotations

from dataclasses import dataclass

from accelmux.core.types import Reason, Tier, require


@dataclass(frozen=True, slots=True, kw_only=True)
class Dispatch:
    """Run the request now. ``lease_bytes`` is the memory granted to it."""

    request_id: str
    service: str
    attempt: int
    lease_bytes: int
    reason: Reason
    detail: str = ""

    def __post_init__(self) -> None:
        require(self.lease_bytes >= 0, "lease_bytes must be >= 0")
        require(self.attempt >= 1, "attempt starts at 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class Enqueue:
    """The request waits. Emitted once per wait cause change, for explanation."""

    request_id: str
    service: str
    reason: Reason
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Reject:
    """The request ends unserved. ``retry_after_s`` tells the client when to retry."""

    request_id: str
    service: str
    reason: Reason
    retry_after_s: float
    detail: str = ""

    def __post_init__(self) -> None:
        require(self.retry_after_s >= 0, "retry_after_s must be >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class Fail:
    """An in-flight request ends with an error (its backend crashed, or it was cut off)."""

    request_id: str
    service: str
    reason: Reason
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Load:
    """Load the service's model. ``kv_pool_bytes`` sizes an LLM's KV cache pool;
    ``from_tier`` is where its weights are now (a parked or sleeping service reloads
    from host RAM)."""

    service: str
    reason: Reason
    weights_bytes: int
    runtime_bytes: int
    kv_pool_bytes: int = 0
    from_tier: Tier = Tier.COLD
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Unload:
    """Free the service's device memory. ``tier``: where its weights go (``cold``: the
    backend releases everything; ``parked``: it keeps them in host RAM; ``sleeping``:
    its process sleeps with them in host RAM)."""

    service: str
    reason: Reason
    tier: Tier = Tier.COLD
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Resize:
    """Set an elastic pool (LLM KV cache) to ``kv_pool_bytes`` without reloading weights."""

    service: str
    kv_pool_bytes: int
    reason: Reason
    detail: str = ""

    def __post_init__(self) -> None:
        require(self.kv_pool_bytes >= 0, "kv_pool_bytes must be >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class Rebatch:
    """The next Dispatch of ``request_id`` runs its units in batches of ``fraction`` of
    the full one (1.0: the full batch again), and its service runs at most ``parallel``
    requests at once meanwhile. Only for services that declare ``shrink``."""

    request_id: str
    service: str
    fraction: float
    parallel: int
    reason: Reason
    detail: str = ""

    def __post_init__(self) -> None:
        require(0 < self.fraction <= 1, "fraction must be in (0, 1]")
        require(self.parallel >= 1, "parallel must be >= 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class Preempt:
    """Stop a running request; it goes back to its queue and runs again later."""

    request_id: str
    service: str
    attempt: int
    reason: Reason
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Pause:
    """Pause a running request between tokens; it keeps its output so far and resumes
    later (:class:`Resume`) with nothing lost or repeated. ``park``: its KV state also
    leaves the device (saved to host RAM, restored on resume); otherwise it keeps its
    place in the KV pool. Only for services whose backend declares ``pause`` (and
    ``park``)."""

    request_id: str
    service: str
    attempt: int
    park: bool
    reason: Reason
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Resume:
    """Continue a paused request (restoring its KV state first when it was parked).
    ``lease_bytes`` is the memory granted to it again."""

    request_id: str
    service: str
    attempt: int
    lease_bytes: int
    reason: Reason
    detail: str = ""

    def __post_init__(self) -> None:
        require(self.lease_bytes >= 0, "lease_bytes must be >= 0")


Action = (
    Dispatch | Enqueue | Reject | Fail | Load | Unload | Resize | Preempt | Pause | Resume | Rebatch
)


def action_kind(action: Action) -> str:
    """The lower-case name of an action, as used in logs and metrics."""
    return type(action).__name__.lower()
