"""Virtual devices (tests, demos): used = what the services report.

Nothing is foreign, unless ``foreign_pid_dir`` names a directory of ``*.pid`` files: the
measured memory of those processes (a test's "foreign" memory hog) is then added to the
device's used bytes, so the Manager sees it as foreign usage and shrinks the budget.
"""

from __future__ import annotations

from pathlib import Path

from accelmux.core.events import MemorySampled
from accelmux.monitors.base import DeviceSample, ServiceProcesses
from accelmux.monitors.process import tree_memory


class VirtualSampler:
    def __init__(self, device: str, *, capacity: int, foreign_pid_dir: str | None = None) -> None:
        self.device = device
        self.capacity = capacity
        self.foreign_pid_dir = Path(foreign_pid_dir) if foreign_pid_dir else None

    def _foreign(self) -> dict[int, int]:
        """Bytes of each foreign process named in ``foreign_pid_dir`` (with its children)."""
        if self.foreign_pid_dir is None or not self.foreign_pid_dir.is_dir():
            return {}
        out: dict[int, int] = {}
        for path in sorted(self.foreign_pid_dir.glob("*.pid")):
            try:
                pid = int(path.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            out[pid] = tree_memory(pid)
        return out

    def sample(self, services: list[ServiceProcesses]) -> DeviceSample:
        per_service = {
            s.service: (s.inprocess_bytes or 0)
            + (s.hosted_bytes or 0)
            + sum(tree_memory(p) for p in s.pids)
            for s in services
        }
        per_pid = self._foreign()
        foreign = sum(per_pid.values())
        used = sum(per_service.values()) + foreign
        return DeviceSample(
            event=MemorySampled(device=self.device, used_bytes=used, per_service=per_service),
            total_bytes=self.capacity,
            details={
                "source": "virtual",
                "used_bytes": used,
                "foreign_bytes": foreign,
                "per_process_bytes": {str(pid): n for pid, n in sorted(per_pid.items())},
            },
        )

    def close(self) -> None:
        return None
