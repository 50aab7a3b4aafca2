"""Build each service's backend from its config section."""

from __future__ import annotations

from pathlib import Path

from accelmux.backends.base import Backend
from accelmux.backends.external import ExternalBackend
from accelmux.backends.fake import FakeBackend
from accelmux.backends.limits import CgroupSupport, detect_cgroup
from accelmux.backends.worker import WorkerPool
from accelmux.config.backends import (
    ExternalBackendConfig,
    FakeBackendConfig,
    WorkerBackendConfig,
)
from accelmux.config.machine import missing_backends
from accelmux.config.schema import AccelmuxConfig
from accelmux.core.specs import MemoryProfile
from accelmux.errors import ConfigError


def build_backends(
    cfg: AccelmuxConfig,
    data_dir: Path,
    *,
    capacities: dict[str, int] | None = None,
    profiles: dict[str, MemoryProfile] | None = None,
) -> dict[str, Backend]:
    """One backend per service; a service without a backend section is a ConfigError (the
    fake test double is never chosen silently: ``backend: {type: fake}`` asks for it).

    ``capacities`` (bytes per device, detected ones included) size an external server's
    ``{gpu_memory_utilization}``; ``profiles`` (the Manager's, GGUF estimates included)
    give its KV bytes per token and workspace. ``worker`` services are hosted by accelmux's
    inference worker process (one shared worker, or one of its own with
    ``isolated: true``): see :mod:`accelmux.worker`.
    """
    problems = missing_backends(cfg)
    if problems:
        raise ConfigError("config", problems)
    out: dict[str, Backend] = {}
    workers: WorkerPool | None = None
    cgroup: CgroupSupport | None = None
    for name, svc in cfg.services.items():
        section = svc.backend
        model = svc.model or name
        device = cfg.devices[cfg.device_of(name)]
        if isinstance(section, FakeBackendConfig):
            out[name] = FakeBackend(
                name,
                svc.kind,
                model,
                section,
                profile=(int(svc.memory.weights), int(svc.memory.runtime)),
            )
        elif isinstance(section, ExternalBackendConfig):
            if cgroup is None:
                cgroup = detect_cgroup()
            profile = (profiles or {}).get(name)
            out[name] = ExternalBackend(
                name,
                model,
                section,
                kv_bytes_per_token=(
                    profile.kv_bytes_per_token if profile else int(svc.memory.kv_per_token)
                ),
                concurrency=svc.concurrency,
                gpu_index=device.index if device.kind == "nvidia" else None,
                data_dir=data_dir,
                workspace_bytes=profile.workspace if profile else int(svc.memory.workspace),
                device_capacity=(capacities or {}).get(cfg.device_of(name))
                or (int(device.capacity) if device.capacity is not None else None),
                cgroup=cgroup,
            )
        elif isinstance(section, WorkerBackendConfig):
            if workers is None:
                workers = WorkerPool(data_dir)
            out[name] = workers.backend(name, svc.kind, section)
    return out
