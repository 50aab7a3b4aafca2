"""Build the backend of each of the Manager's services from its config section.

A service that may run on several devices is one Manager service per device (a
**replica**, :mod:`accelmux.core.placement`): each replica gets a backend of its own,
built from the same config section and named by the replica (``chat@gpu1``), on the
replica's device. An external server's replica sees only its own GPU
(``CUDA_VISIBLE_DEVICES`` is the device's index) and its ``{gpu_memory_utilization}`` is
a share of that device's capacity; each replica listens on a free port of its own (a
fixed ``port`` cannot serve two: the config check refuses it). Worker replicas are
hosted by the same worker process: their device is the Manager's accounting, the
worker sets no per-device visibility.
"""

from __future__ import annotations

from collections.abc import Sequence
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
from accelmux.config.load import replica_problems
from accelmux.config.machine import missing_backends
from accelmux.config.schema import AccelmuxConfig, DeviceConfig
from accelmux.core.degrade import VariantMode
from accelmux.core.specs import ServiceSpec
from accelmux.errors import ConfigError


def gpu_index(device: DeviceConfig) -> int | None:
    """The GPU a server on ``device`` may see (``CUDA_VISIBLE_DEVICES``): its index on
    an NVIDIA device, None (left as it is) on any other."""
    return device.index if device.kind == "nvidia" else None


def build_backends(
    cfg: AccelmuxConfig,
    data_dir: Path,
    services: Sequence[ServiceSpec],
    *,
    capacities: dict[str, int] | None = None,
) -> dict[str, Backend]:
    """One backend per Manager service (``services``: an ordinary service, or one replica
    of a service that runs on several devices), keyed by the Manager's name. A service
    without a backend section is a ConfigError (the fake test double is never chosen
    silently: ``backend: {type: fake}`` asks for it).

    ``capacities`` (bytes per device, detected ones included) size an external server's
    ``{gpu_memory_utilization}``; each spec's profile (the Manager's, GGUF estimates
    included) gives its KV bytes per token and workspace. ``worker`` services are hosted
    by accelmux's inference worker process (one shared worker, or one of its own with
    ``isolated: true``): see :mod:`accelmux.worker`.
    """
    problems = [*missing_backends(cfg), *_replica_problems(cfg, services)]
    if problems:
        raise ConfigError("config", problems)
    out: dict[str, Backend] = {}
    workers: WorkerPool | None = None
    cgroup: CgroupSupport | None = None
    for spec in services:
        svc = cfg.services[spec.addressed_as]
        section = svc.backend
        model = svc.model or spec.addressed_as
        if isinstance(section, FakeBackendConfig):
            out[spec.name] = FakeBackend(
                spec.name,
                svc.kind,
                model,
                section,
                # a lesser form of a service holds its own share (core/degrade.py)
                profile=(spec.profile.weights, spec.profile.runtime)
                if spec.variant is not None
                else (int(svc.memory.weights), int(svc.memory.runtime)),
                answers_as=spec.addressed_as,
            )
        elif isinstance(section, ExternalBackendConfig):
            if cgroup is None:
                cgroup = detect_cgroup()
            out[spec.name] = _external(cfg, data_dir, spec, section, capacities or {}, cgroup)
        elif isinstance(section, WorkerBackendConfig):
            if workers is None:
                workers = WorkerPool(data_dir)
            out[spec.name] = workers.backend(
                spec.name,
                svc.kind,
                form_section(section, spec),
                gpu_index=gpu_index(cfg.devices[spec.device]),
                device=spec.device,
            )
    return out


def form_section(section: WorkerBackendConfig, spec: ServiceSpec) -> WorkerBackendConfig:
    """The worker section of one form of a service that may degrade
    (:mod:`accelmux.core.degrade`): a partial offload loads llama.cpp with its
    ``n_gpu_layers``; the full form and the CPU form (a host device: no GPU) as
    configured."""
    variant = spec.variant
    if variant is None or variant.mode is not VariantMode.OFFLOAD:
        return section
    options = {**section.options, "n_gpu_layers": variant.n_gpu_layers}
    return section.model_copy(update={"options": options})


def _external(
    cfg: AccelmuxConfig,
    data_dir: Path,
    spec: ServiceSpec,
    section: ExternalBackendConfig,
    capacities: dict[str, int],
    cgroup: CgroupSupport,
) -> ExternalBackend:
    """The external server of one Manager service, on that service's own device."""
    svc = cfg.services[spec.addressed_as]
    device = cfg.devices[spec.device]
    return ExternalBackend(
        spec.name,
        svc.model or spec.addressed_as,
        section,
        kv_bytes_per_token=spec.profile.kv_bytes_per_token,
        concurrency=svc.concurrency,
        gpu_index=gpu_index(device),
        data_dir=data_dir,
        workspace_bytes=spec.profile.workspace,
        device_capacity=capacities.get(spec.device)
        or (int(device.capacity) if device.capacity is not None else None),
        cgroup=cgroup,
    )


def _replica_problems(cfg: AccelmuxConfig, services: Sequence[ServiceSpec]) -> list[str]:
    """Why an external server cannot run the replicas it was given (a fixed port, its
    own ``CUDA_VISIBLE_DEVICES``): the config check says so too, for what it can see."""
    devices: dict[str, list[str]] = {}
    for spec in services:
        if spec.group:
            devices.setdefault(spec.group, []).append(spec.device)
    problems = []
    for group, on in devices.items():
        section = cfg.services[group].backend
        if isinstance(section, ExternalBackendConfig):
            problems += replica_problems(cfg, group, section, on)
    return problems
