"""The sampler Protocol and what the runtime tells samplers about services."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from accelmux.core.events import MemorySampled


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceProcesses:
    """How to find one service's memory: its root pids and its in-process bytes."""

    service: str
    pids: list[int] = field(default_factory=list)
    inprocess_bytes: int | None = None
    #: Bytes measured in a process accelmux runs models in (its inference worker), already
    #: attributed to this service; unlike ``inprocess_bytes`` they are not accelmux's own.
    hosted_bytes: int | None = None
    #: (pid of the shared inference worker hosting it, the bytes that worker says this
    #: service holds on the GPU): the NVIDIA monitor reconciles them with NVML's figure
    #: for that process (:func:`accelmux.monitors.nvidia.reconcile_worker`).
    gpu_claim: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceSample:
    """One measurement, as an event for the Manager and as details for the status page."""

    event: MemorySampled
    total_bytes: int
    details: dict[str, Any] = field(default_factory=dict)


class DeviceSampler(Protocol):
    device: str

    def sample(self, services: list[ServiceProcesses]) -> DeviceSample | None:
        """Measure now (blocking; the runtime calls it in a worker thread)."""
        ...

    def close(self) -> None: ...
