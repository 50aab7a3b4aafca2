"""Turn a validated config into the core's plain specs."""

from __future__ import annotations

import dataclasses

from accelmux.config.degrade import degrade_forms
from accelmux.config.schema import AccelmuxConfig, MemoryConfig, ShrinkConfig, parse_window
from accelmux.core.placement import place_pinned, replica_name
from accelmux.core.shrink import BatchShrink
from accelmux.core.specs import (
    Capabilities,
    DeviceSpec,
    ManagerSpec,
    MemoryProfile,
    PolicyKnobs,
    ServiceSpec,
)
from accelmux.core.types import Residency, ServiceKind
from accelmux.errors import ConfigError
from accelmux.models.gguf_profile import gguf_profile, llama_memory_estimate


def to_manager_spec(
    cfg: AccelmuxConfig,
    *,
    capacities: dict[str, int] | None = None,
    budgets: dict[str, int] | None = None,
    clock_origin_s_of_day: float = 0.0,
    gguf_profiles: dict[str, MemoryProfile] | None = None,
    capabilities: dict[str, Capabilities] | None = None,
    host_budget: int = 0,
) -> ManagerSpec:
    """Build a :class:`ManagerSpec`.

    ``capacities``/``budgets`` fill what the config leaves to detection (nvidia, host).
    ``gguf_profiles`` replaces the profile of services whose memory came from GGUF.
    ``capabilities`` are what each service's backend declared (the daemon's backends);
    a service without an entry gets what its backend section declares, and one without
    a backend section (a scenario for the simulator) the simulated backend's.
    ``host_budget`` is the park budget when the config leaves it to detection.
    """
    capacities = capacities or {}
    budgets = budgets or {}
    devices = []
    for name, dev in cfg.devices.items():
        capacity = int(dev.capacity) if dev.capacity is not None else capacities.get(name)
        if capacity is None:
            raise ConfigError(f"devices.{name}", ["capacity unknown: not configured nor detected"])
        budget = int(dev.budget) if dev.budget is not None else budgets.get(name, capacity)
        devices.append(
            DeviceSpec(
                name=name,
                kind=dev.kind,
                capacity_bytes=capacity,
                budget_bytes=min(budget, capacity),
                headroom_bytes=int(dev.headroom),
                load_bandwidth_bps=float(dev.load_bandwidth),
                host_bandwidth_bps=float(dev.host_bandwidth),
            )
        )
    profiles: dict[str, MemoryProfile] = {}
    for name, svc in cfg.services.items():
        mem = svc.memory
        profile = (gguf_profiles or {}).get(name)
        if profile is None and mem.gguf:
            profile = gguf_memory_profile(mem)
        profiles[name] = profile or MemoryProfile(
            weights=int(mem.weights),
            runtime=int(mem.runtime),
            kv_bytes_per_token=int(mem.kv_per_token),
            kv_floor=int(mem.kv_floor),
            kv_ceiling=int(mem.kv_ceiling),
            workspace=int(mem.workspace),
            per_unit=float(mem.per_unit),
        )
    placement = service_devices(cfg, devices, profiles)
    services = []
    for name, svc in cfg.services.items():
        spec = ServiceSpec(
            name=name,
            kind=svc.kind,
            cls=svc.cls,
            residency=svc.residency,
            device=placement[name][0],
            profile=profiles[name],
            concurrency=svc.concurrency,
            ttl_s=svc.ttl_s,
            init_s=svc.init_s,
            queue_limit=svc.queue.limit,
            deadline_s=svc.queue.deadline_s,
            windows=tuple(parse_window(w) for w in svc.windows),
            model=svc.model or name,
            capabilities=(capabilities or {}).get(name)
            or (svc.backend.capabilities(svc.kind) if svc.backend else Capabilities()),
            weights_key=_weights_key(svc.backend, svc.kind, placement[name][0]),
            steady=svc.steady if svc.steady is not None else svc.kind is ServiceKind.CAMERA,
            shrink=_shrink(svc.shrink),
            objective_s=(svc.slo.ttft_s if svc.kind.is_llm else None) or svc.slo.latency_s,
        )
        if svc.degrade is not None:
            services += degrade_forms(spec, svc)
            continue
        if len(placement[name]) == 1:
            services.append(spec)
            continue
        for device in placement[name]:
            replica = replica_name(name, device)
            services.append(
                dataclasses.replace(
                    spec,
                    name=replica,
                    group=name,
                    device=device,
                    capabilities=(capabilities or {}).get(replica, spec.capabilities),
                    weights_key=_weights_key(svc.backend, svc.kind, device),
                )
            )
    p = cfg.policy
    knobs = PolicyKnobs(
        safety_factor=p.safety_factor,
        calibration_window=p.calibration_window,
        on_demand_ttl_s=p.on_demand_ttl_s,
        reuse_horizon_s=p.reuse_horizon_s,
        spare_fraction=p.spare_fraction,
        crash_backoff_s=p.crash_backoff_s,
        crash_backoff_max_s=p.crash_backoff_max_s,
        balloon_idle_s=p.balloon_idle_s,
        realtime_grace_s=p.realtime_grace_s,
        batch_age_fraction=p.batch_age_fraction,
        prewarm=p.prewarm,
        disabled=frozenset(p.disable),
    )
    return ManagerSpec(
        devices=tuple(devices),
        services=tuple(services),
        knobs=knobs,
        clock_origin_s_of_day=clock_origin_s_of_day,
        host_budget_bytes=int(cfg.host.park_budget)
        if cfg.host.park_budget is not None
        else host_budget,
    )


def service_devices(
    cfg: AccelmuxConfig, devices: list[DeviceSpec], profiles: dict[str, MemoryProfile]
) -> dict[str, list[str]]:
    """The devices each service runs on: one for a service given one device or pinned
    (placed once, :func:`~accelmux.core.placement.place_pinned`), else every device it
    may use that can hold it (one replica each)."""
    usable = {d.name: d.usable_bytes for d in devices}
    out: dict[str, list[str]] = {}
    pinned: list[tuple[str, int, list[str]]] = []
    for name, svc in cfg.services.items():
        p = profiles[name]
        candidates = cfg.devices_of(name)
        fitting = [d for d in candidates if p.resident_floor + p.workspace <= usable[d]]
        out[name] = fitting or candidates[:1]
        if svc.residency is Residency.PINNED and len(out[name]) > 1:
            pinned.append((name, p.resident_floor, out[name]))
    for name, device in place_pinned(usable, pinned).items():
        out[name] = [device]
    return out


def with_capabilities(spec: ManagerSpec, declared: dict[str, Capabilities]) -> ManagerSpec:
    """``spec`` with each named service's capabilities replaced by what was declared."""
    services = tuple(
        dataclasses.replace(s, capabilities=declared[s.name]) if s.name in declared else s
        for s in spec.services
    )
    return dataclasses.replace(spec, services=services)


#: KV pool bounds (tokens) of an LLM whose profile comes from its GGUF file alone.
GGUF_KV_FLOOR_TOKENS = 512
GGUF_KV_CEILING_TOKENS = 4096


def gguf_memory_profile(mem: MemoryConfig) -> MemoryProfile:
    """``memory.gguf``: weights and KV bytes per token from the GGUF header; runtime from
    llama.cpp's estimate; KV floor/ceiling 512/4096 tokens. Sizes set in the config win."""
    assert mem.gguf is not None
    gguf = gguf_profile(mem.gguf)
    est = llama_memory_estimate(gguf, GGUF_KV_FLOOR_TOKENS)
    per_token = int(mem.kv_per_token) or gguf.kv_bytes_per_token
    return MemoryProfile(
        weights=int(mem.weights) or gguf.weights_bytes,
        runtime=int(mem.runtime) or est.runtime_bytes + est.output_bytes,
        kv_bytes_per_token=per_token,
        kv_floor=int(mem.kv_floor) or per_token * GGUF_KV_FLOOR_TOKENS,
        kv_ceiling=int(mem.kv_ceiling) or per_token * GGUF_KV_CEILING_TOKENS,
        workspace=int(mem.workspace),
        per_unit=float(mem.per_unit),
    )


def _weights_key(backend: object, kind: ServiceKind, device: str) -> str:
    """Services of the shared inference worker that load the same model on the same
    device share one copy."""
    key = getattr(backend, "weights_key", None)
    return str(key(kind, device)) if callable(key) else ""


def _shrink(cfg: ShrinkConfig | None) -> BatchShrink | None:
    """The core's view of a ``shrink:`` section."""
    if cfg is None:
        return None
    return BatchShrink(min_fraction=cfg.min_batch_fraction, min_parallel=cfg.min_parallel)
