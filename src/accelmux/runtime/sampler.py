"""The memory sampler loop: every ``server.sample_interval_s``, measure each device.

Each round lets backends that read their server's own metrics do so (external servers),
tells each device's sampler which processes and bytes belong to which service (a shared
inference worker's services: what the worker says each holds on the GPU), measures
in a worker thread (a monitor may block), and submits one ``MemorySampled`` per device:
the Manager reconciles its ledger with what was measured (foreign and reserved memory).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from accelmux.backends.base import Backend
from accelmux.core.events import Event
from accelmux.core.specs import ManagerSpec
from accelmux.monitors.base import DeviceSample, DeviceSampler, ServiceProcesses

log = logging.getLogger("accelmux.runtime")


class SamplerLoop:
    def __init__(
        self,
        spec: ManagerSpec,
        backends: dict[str, Backend],
        samplers: dict[str, DeviceSampler],
        submit: Callable[[Event], None],
    ) -> None:
        self._spec = spec
        self._backends = backends
        self.samplers = samplers
        self._submit = submit
        #: The last sample of each device and when it was taken (wall clock).
        self.last_samples: dict[str, tuple[float, DeviceSample]] = {}
        #: When the last round ended, measured or failed (monotonic; None: none yet).
        self.last_round_at: float | None = None

    async def run(self, interval_s: float) -> None:
        """Sample every ``interval_s`` until cancelled; a failed round is logged."""
        while True:
            try:
                await self.sample_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("memory sampling failed: %s", exc)
            self.last_round_at = time.monotonic()
            await asyncio.sleep(interval_s)

    async def sample_once(self) -> None:
        await self._refresh_backends()
        samples = await asyncio.to_thread(self._sample_all, self._processes())
        now = time.time()
        for sample in samples:
            self.last_samples[sample.event.device] = (now, sample)
            self._submit(sample.event)

    def close(self) -> None:
        for sampler in self.samplers.values():
            sampler.close()

    def _processes(self) -> dict[str, list[ServiceProcesses]]:
        groups: dict[str, list[ServiceProcesses]] = {d: [] for d in self.samplers}
        for svc in self._spec.services:
            backend = self._backends.get(svc.name)
            if backend is None or svc.device not in groups:
                continue
            hosted = getattr(backend, "hosted_bytes", None)  # inference-worker backends
            claim = getattr(backend, "gpu_claim", None)
            groups[svc.device].append(
                ServiceProcesses(
                    service=svc.name,
                    pids=backend.pids(),
                    inprocess_bytes=backend.memory_bytes(),
                    hosted_bytes=hosted() if callable(hosted) else None,
                    gpu_claim=claim() if callable(claim) else None,
                )
            )
        return groups

    def _sample_all(self, groups: dict[str, list[ServiceProcesses]]) -> list[DeviceSample]:
        out = []
        for device, sampler in self.samplers.items():
            try:
                sample = sampler.sample(groups.get(device, []))
            except Exception as exc:  # a monitor must never take the daemon down
                log.warning("sampling %s failed: %s", device, exc)
                continue
            if sample is not None:
                out.append(sample)
        return out

    async def _refresh_backends(self) -> None:
        """Let backends that read their server's own metrics do so (external servers)."""
        calls = []
        for backend in self._backends.values():
            refresh = getattr(backend, "refresh", None)
            if callable(refresh):
                calls.append(refresh())
        for outcome in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(outcome, Exception):
                log.debug("reading a server's metrics failed: %s", outcome)
