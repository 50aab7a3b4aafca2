"""The devices a config leaves to detection, and the sampler that measures each device."""

from __future__ import annotations

from accelmux.config.schema import AccelmuxConfig
from accelmux.core.manager import Manager
from accelmux.errors import ConfigError
from accelmux.monitors.base import DeviceSampler
from accelmux.monitors.host import DEFAULT_HOST_BUDGET_FRACTION, HostSampler, host_total
from accelmux.monitors.nvidia import NvidiaSampler, gpu_total
from accelmux.monitors.virtual import VirtualSampler


def detect_devices(cfg: AccelmuxConfig) -> tuple[dict[str, int], dict[str, int]]:
    """Capacities and default budgets of devices the config leaves to detection."""
    capacities: dict[str, int] = {}
    budgets: dict[str, int] = {}
    for name, dev in cfg.devices.items():
        if dev.capacity is not None:
            continue
        if dev.kind == "host":
            total = host_total()
            capacities[name] = total
            if dev.budget is None:
                budgets[name] = int(total * DEFAULT_HOST_BUDGET_FRACTION)
        elif dev.kind == "nvidia":
            total_gpu = gpu_total(dev.index)
            if total_gpu is None:
                raise ConfigError(
                    f"devices.{name}",
                    [
                        f"no NVIDIA GPU {dev.index} found (NVML unavailable) and no capacity "
                        "configured: set devices.{name}.capacity or use a host/virtual device"
                    ],
                )
            capacities[name] = total_gpu
    return capacities, budgets


def build_samplers(manager: Manager, cfg: AccelmuxConfig) -> dict[str, DeviceSampler]:
    """One sampler per device of the Manager: host RAM, an NVIDIA GPU, or a virtual one."""
    out: dict[str, DeviceSampler] = {}
    for spec in manager.spec.devices:
        dev = cfg.devices[spec.name]
        if spec.kind == "host":
            out[spec.name] = HostSampler(
                spec.name, capacity=spec.capacity_bytes, budget=spec.budget_bytes
            )
        elif spec.kind == "nvidia":
            out[spec.name] = NvidiaSampler(
                spec.name, index=dev.index, capacity=spec.capacity_bytes, budget=spec.budget_bytes
            )
        else:
            out[spec.name] = VirtualSampler(
                spec.name, capacity=spec.capacity_bytes, foreign_pid_dir=dev.foreign_pid_dir
            )
    return out
