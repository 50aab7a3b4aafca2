"""Host (shared-memory) devices: RAM measured with psutil.

Used for iGPUs, NPUs and unified-memory machines, whose accelerator memory is host RAM.
``used = total - available``. See :mod:`accelmux.monitors` for what "foreign" means here.
"""

from __future__ import annotations

import psutil

from accelmux.core.events import MemorySampled
from accelmux.monitors.base import DeviceSample, ServiceProcesses
from accelmux.monitors.process import own_memory, tree_memory

#: Default share of host RAM accelmux may use when the config sets no budget.
DEFAULT_HOST_BUDGET_FRACTION = 0.75


def host_total() -> int:
    return int(psutil.virtual_memory().total)


class HostSampler:
    def __init__(self, device: str, *, capacity: int, budget: int) -> None:
        self.device = device
        self.capacity = capacity
        self.slack = max(0, capacity - budget)

    def sample(self, services: list[ServiceProcesses]) -> DeviceSample:
        vm = psutil.virtual_memory()
        used = int(vm.total - vm.available)
        per_service: dict[str, int] = {}
        inprocess = 0
        for svc in services:
            n = 0
            if svc.inprocess_bytes:
                n += svc.inprocess_bytes
                inprocess += svc.inprocess_bytes
            n += svc.hosted_bytes or 0
            for pid in svc.pids:
                n += tree_memory(pid)
            per_service[svc.service] = n
        own = own_memory()
        baseline = max(0, own - inprocess) + self.slack
        event = MemorySampled(
            device=self.device,
            used_bytes=used,
            per_service=per_service,
            baseline_bytes=baseline,
        )
        managed = sum(per_service.values())
        return DeviceSample(
            event=event,
            total_bytes=int(vm.total),
            details={
                "source": "psutil",
                "used_bytes": used,
                "accelmux_process_bytes": own,
                "baseline_bytes": baseline,
                "foreign_bytes": max(0, used - managed - baseline),
            },
        )

    def close(self) -> None:
        return None
