"""Validation of specs, events and actions; Window arithmetic; the small enums."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from accelmux.core.actions import Dispatch, Load, Reject, Resize, action_kind
from accelmux.core.events import (
    AdminCommand,
    Demand,
    MemorySampled,
    RequestArrived,
    RequestFinished,
)
from accelmux.core.specs import (
    DAY_S,
    DeviceSpec,
    ManagerSpec,
    MemoryProfile,
    PolicyKnobs,
    ServiceSpec,
    Window,
)
from accelmux.core.types import GIB, Reason, Residency, ServiceClass, ServiceKind

from .support import device, plain_profile, service

HOUR = 3600.0


# ---- DeviceSpec ----------------------------------------------------------------
def test_device_usable_is_budget_minus_headroom() -> None:
    dev = DeviceSpec(
        name="g", kind="nvidia", capacity_bytes=16 * GIB, budget_bytes=12 * GIB, headroom_bytes=GIB
    )
    assert dev.usable_bytes == 11 * GIB


@pytest.mark.parametrize(
    "kwargs",
    [
        {"capacity_bytes": 0},
        {"budget_bytes": 0},
        {"budget_bytes": 17 * GIB},
        {"headroom_bytes": -1},
        {"headroom_bytes": 12 * GIB},
        {"load_bandwidth_bps": 0.0},
    ],
)
def test_device_validation(kwargs: dict[str, Any]) -> None:
    base: dict[str, Any] = {
        "name": "g",
        "kind": "virtual",
        "capacity_bytes": 16 * GIB,
        "budget_bytes": 12 * GIB,
        "headroom_bytes": GIB,
    }
    with pytest.raises(ValueError, match="device g"):
        DeviceSpec(**(base | kwargs))


# ---- MemoryProfile ---------------------------------------------------------------
def test_profile_floor_and_elasticity() -> None:
    p = MemoryProfile(weights=10, runtime=5, kv_floor=3, kv_ceiling=7)
    assert p.resident_floor == 18
    assert p.elastic
    assert not MemoryProfile(weights=1, kv_floor=4, kv_ceiling=4).elastic


@pytest.mark.parametrize(
    "kwargs",
    [
        {"weights": -1},
        {"runtime": -1},
        {"kv_bytes_per_token": -1},
        {"kv_floor": -1},
        {"kv_floor": 5, "kv_ceiling": 4},
        {"workspace": -1},
        {"per_unit": -0.5},
    ],
)
def test_profile_validation(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        MemoryProfile(**({"weights": 1} | kwargs))


# ---- Window ------------------------------------------------------------------------
def test_window_contains_within_a_day() -> None:
    w = Window(start_s=2 * HOUR, end_s=6 * HOUR)
    assert w.contains(2 * HOUR)
    assert w.contains(5 * HOUR)
    assert not w.contains(6 * HOUR)  # end is exclusive
    assert not w.contains(HOUR)
    assert w.contains(DAY_S + 3 * HOUR)  # any day


def test_window_wrapping_midnight() -> None:
    w = Window(start_s=22 * HOUR, end_s=2 * HOUR)
    assert w.contains(23 * HOUR)
    assert w.contains(0.0)
    assert w.contains(HOUR)
    assert not w.contains(2 * HOUR)
    assert not w.contains(12 * HOUR)


def test_window_ending_at_midnight() -> None:
    w = Window(start_s=20 * HOUR, end_s=DAY_S)
    assert w.contains(23.99 * HOUR)
    assert not w.contains(0.0)
    assert w.seconds_until_edge(23 * HOUR) == pytest.approx(HOUR)


def test_seconds_until_edge() -> None:
    w = Window(start_s=2 * HOUR, end_s=6 * HOUR)
    assert w.seconds_until_edge(HOUR) == pytest.approx(HOUR)  # opens
    assert w.seconds_until_edge(3 * HOUR) == pytest.approx(3 * HOUR)  # closes
    assert w.seconds_until_edge(2 * HOUR) == pytest.approx(4 * HOUR)  # at an edge: the next one
    assert w.seconds_until_edge(7 * HOUR) == pytest.approx(19 * HOUR)
    wrap = Window(start_s=22 * HOUR, end_s=2 * HOUR)
    assert wrap.seconds_until_edge(23 * HOUR) == pytest.approx(3 * HOUR)
    assert wrap.seconds_until_edge(12 * HOUR) == pytest.approx(10 * HOUR)


@pytest.mark.parametrize(
    ("start", "end"), [(-1.0, 10.0), (DAY_S, 10.0), (0.0, DAY_S + 1), (5.0, 5.0)]
)
def test_window_validation(start: float, end: float) -> None:
    with pytest.raises(ValueError):
        Window(start_s=start, end_s=end)


# ---- ServiceSpec, knobs, ManagerSpec -----------------------------------------------
def test_service_in_window() -> None:
    assert service("a").in_window(12 * HOUR)  # no windows: always
    s = service("b", windows=(Window(start_s=HOUR, end_s=2 * HOUR), Window(start_s=0, end_s=60)))
    assert s.in_window(30.0)
    assert s.in_window(1.5 * HOUR)
    assert not s.in_window(3 * HOUR)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"concurrency": 0},
        {"ttl_s": -1.0},
        {"queue_limit": -1},
        {"deadline_s": 0.0},
        {"init_s": -1.0},
    ],
)
def test_service_validation(kwargs: dict[str, Any]) -> None:
    base: dict[str, Any] = {
        "name": "svc",
        "kind": ServiceKind.IMAGE,
        "cls": ServiceClass.INTERACTIVE,
        "residency": Residency.WARM,
        "device": "gpu",
        "profile": plain_profile(),
    }
    with pytest.raises(ValueError, match="service svc"):
        ServiceSpec(**(base | kwargs))


@pytest.mark.parametrize(
    "kwargs",
    [{"safety_factor": 0.9}, {"calibration_window": 0}, {"spare_fraction": 1.0}],
)
def test_knobs_validation(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        PolicyKnobs(**kwargs)


def test_manager_spec_validation() -> None:
    with pytest.raises(ValueError, match="device names"):
        ManagerSpec(devices=(device(), device()), services=())
    with pytest.raises(ValueError, match="service names"):
        ManagerSpec(devices=(device(),), services=(service("a"), service("a")))
    with pytest.raises(ValueError, match="unknown device"):
        ManagerSpec(devices=(device(),), services=(service("a", device_name="npu"),))
    ok = ManagerSpec(devices=(device(),), services=(service("a"),))
    assert ok.knobs == PolicyKnobs()


# ---- events and actions ------------------------------------------------------------
@pytest.mark.parametrize(
    "build",
    [
        lambda: Demand(kv_tokens=-1),
        lambda: Demand(units=-0.1),
        lambda: Demand(prompt_tokens=-1),
        lambda: RequestArrived(request_id="", service="a"),
        lambda: RequestArrived(request_id="r", service=""),
        lambda: RequestFinished(request_id="r", attempt=0),
        lambda: RequestFinished(request_id="r", attempt=1, peak_bytes=-1),
        lambda: MemorySampled(device="g", used_bytes=-1),
        lambda: MemorySampled(device="g", used_bytes=1, per_service={"a": -1}),
        lambda: AdminCommand(service="a", op="reboot"),
        lambda: Dispatch(
            request_id="r", service="a", attempt=1, lease_bytes=-1, reason=Reason.FITS
        ),
        lambda: Dispatch(request_id="r", service="a", attempt=0, lease_bytes=0, reason=Reason.FITS),
        lambda: Reject(request_id="r", service="a", reason=Reason.QUEUE_FULL, retry_after_s=-1),
        lambda: Resize(service="a", kv_pool_bytes=-1, reason=Reason.BALLOON_GROW),
    ],
)
def test_events_and_actions_are_validated_when_built(build: Any) -> None:
    with pytest.raises(ValueError):
        build()


def test_events_and_actions_are_frozen_and_keyword_only() -> None:
    event = RequestArrived(request_id="r", service="a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.service = "b"  # type: ignore[misc]
    with pytest.raises(TypeError):
        Demand(1)  # type: ignore[call-arg]
    action = Load(service="a", reason=Reason.DEMAND, weights_bytes=1, runtime_bytes=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        action.reason = Reason.ADMIN  # type: ignore[misc]
    assert action_kind(action) == "load"


# ---- enums ------------------------------------------------------------------------------
def test_class_order_labels_and_parse() -> None:
    assert ServiceClass.REALTIME < ServiceClass.INTERACTIVE < ServiceClass.BATCH
    assert ServiceClass.BATCH < ServiceClass.BACKGROUND
    assert ServiceClass.BATCH.label == "batch"
    assert ServiceClass.parse("Realtime") is ServiceClass.REALTIME
    assert ServiceKind.CHAT.is_llm and ServiceKind.COMPLETION.is_llm
    assert not ServiceKind.ASR.is_llm
