"""Virtual devices (tests, demos): used = what the services report; nothing is foreign."""

from __future__ import annotations

from accelmux.core.events import MemorySampled
from accelmux.monitors.base import DeviceSample, ServiceProcesses
from accelmux.monitors.process import tree_memory


class VirtualSampler:
    def __init__(self, device: str, *, capacity: int) -> None:
        self.device = device
        self.capacity = capacity

    def sample(self, services: list[ServiceProcesses]) -> DeviceSample:
        per_service = {
            s.service: (s.inprocess_bytes or 0) + sum(tree_memory(p) for p in s.pids)
            for s in services
        }
        used = sum(per_service.values())
        return DeviceSample(
            event=MemorySampled(device=self.device, used_bytes=used, per_service=per_service),
            total_bytes=self.capacity,
            details={"source": "virtual", "used_bytes": used, "foreign_bytes": 0},
        )

    def close(self) -> None:
        return None
