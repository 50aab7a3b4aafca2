"""Builders shared by the core tests: devices, services, managers and event shortcuts."""

from __future__ import annotations

from typing import TypeVar

from accelmux.core.actions import Action, Dispatch, Enqueue, Load, Reject, Unload
from accelmux.core.events import (
    Demand,
    LoadFinished,
    RequestArrived,
    RequestFinished,
    ResizeFinished,
)
from accelmux.core.manager import Manager
from accelmux.core.policies import make_policy
from accelmux.core.specs import (
    DeviceSpec,
    ManagerSpec,
    MemoryProfile,
    PolicyKnobs,
    ServiceSpec,
    Window,
)
from accelmux.core.types import GIB, MIB, Residency, ServiceClass, ServiceKind

A = TypeVar("A")


def device(
    name: str = "gpu", *, budget: int = 12 * GIB, headroom: int = GIB // 2, capacity: int = 0
) -> DeviceSpec:
    return DeviceSpec(
        name=name,
        kind="virtual",
        capacity_bytes=capacity or budget,
        budget_bytes=budget,
        headroom_bytes=headroom,
    )


def plain_profile(
    weights: int = GIB, runtime: int = 0, workspace: int = 100 * MIB, per_unit: float = 0.0
) -> MemoryProfile:
    return MemoryProfile(weights=weights, runtime=runtime, workspace=workspace, per_unit=per_unit)


def llm_profile(
    weights: int = 4 * GIB,
    runtime: int = 0,
    *,
    kv_per_token: int = 128 * 1024,
    kv_floor: int = 512 * MIB,
    kv_ceiling: int = 2 * GIB,
    workspace: int = 0,
) -> MemoryProfile:
    return MemoryProfile(
        weights=weights,
        runtime=runtime,
        kv_bytes_per_token=kv_per_token,
        kv_floor=kv_floor,
        kv_ceiling=kv_ceiling,
        workspace=workspace,
    )


def service(
    name: str,
    *,
    cls: ServiceClass = ServiceClass.INTERACTIVE,
    residency: Residency = Residency.WARM,
    profile: MemoryProfile | None = None,
    kind: ServiceKind = ServiceKind.IMAGE,
    device_name: str = "gpu",
    concurrency: int = 1,
    ttl_s: float = 300.0,
    queue_limit: int = 32,
    deadline_s: float = 30.0,
    windows: tuple[Window, ...] = (),
) -> ServiceSpec:
    return ServiceSpec(
        name=name,
        kind=kind,
        cls=cls,
        residency=residency,
        device=device_name,
        profile=profile if profile is not None else plain_profile(),
        concurrency=concurrency,
        ttl_s=ttl_s,
        queue_limit=queue_limit,
        deadline_s=deadline_s,
        windows=windows,
    )


def manager(
    *services: ServiceSpec,
    devices: tuple[DeviceSpec, ...] | None = None,
    knobs: PolicyKnobs | None = None,
    origin_s_of_day: float = 0.0,
) -> Manager:
    spec = ManagerSpec(
        devices=devices if devices is not None else (device(),),
        services=tuple(services),
        knobs=knobs if knobs is not None else PolicyKnobs(prewarm=False),
        clock_origin_s_of_day=origin_s_of_day,
    )
    return Manager(spec, make_policy("accelmux"))


def arrive(request_id: str, svc: str, *, units: float = 0.0, kv_tokens: int = 0) -> RequestArrived:
    return RequestArrived(
        request_id=request_id, service=svc, demand=Demand(units=units, kv_tokens=kv_tokens)
    )


def done(request_id: str, attempt: int = 1, peak: int | None = None) -> RequestFinished:
    return RequestFinished(request_id=request_id, attempt=attempt, peak_bytes=peak)


def loaded(svc: str) -> LoadFinished:
    return LoadFinished(service=svc)


def resized(svc: str, kv_pool_bytes: int, *, ok: bool = True) -> ResizeFinished:
    return ResizeFinished(
        service=svc, kv_pool_bytes=kv_pool_bytes, ok=ok, error=None if ok else "refused"
    )


def of(kind: type[A], actions: list[Action]) -> list[A]:
    return [a for a in actions if isinstance(a, kind)]


def dispatched(actions: list[Action]) -> list[str]:
    return [a.request_id for a in actions if isinstance(a, Dispatch)]


def rejected(actions: list[Action]) -> dict[str, Reject]:
    return {a.request_id: a for a in actions if isinstance(a, Reject)}


def enqueued(actions: list[Action]) -> dict[str, Enqueue]:
    return {a.request_id: a for a in actions if isinstance(a, Enqueue)}


def loads(actions: list[Action]) -> list[Load]:
    return [a for a in actions if isinstance(a, Load)]


def unloads(actions: list[Action]) -> list[Unload]:
    return [a for a in actions if isinstance(a, Unload)]


def up(m: Manager, *names: str, now: float = 0.0) -> list[Action]:
    """Bring ``names`` to LOADED and idle by demand: one empty request each, served."""
    out = m.start(now)
    for n in names:
        rid = f"warmup-{n}"
        out += m.handle(arrive(rid, n), now)
        out += m.handle(LoadFinished(service=n), now)
        out += m.handle(done(rid), now)
    return out


#: Knobs that make numbers exact in tests: no safety factor, no prewarming.
EXACT = PolicyKnobs(prewarm=False, safety_factor=1.0)
#: EXACT with the TTL applied to the second: an idle service is not kept past it while
#: memory is spare (``idle_keep`` off), for tests of the TTL itself.
EXACT_TTL = PolicyKnobs(prewarm=False, safety_factor=1.0, disabled=frozenset({"idle_keep"}))
