"""``/admin/explain`` adds up: every category the ledger uses, overhead included, and their
sum is the device's capacity, for any sequence of events (a property test over the
core's random specs and event sequences, with memory samples that carry the workers'
overhead and the device's own baseline)."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.core.fake_executor import FakeExecutor
from tests.core.test_properties import Op, apply_op, manager_specs, ops_strategy

from accelmux.core.events import MemorySampled
from accelmux.core.manager import Manager
from accelmux.core.policies import make_policy
from accelmux.core.specs import ManagerSpec
from accelmux.core.types import GIB, MIB, Category
from accelmux.runtime.explain import DEVICE_CATEGORIES, LEDGER_CATEGORIES, ledger_picture, why_full


def _sample(ex: FakeExecutor, op: Op) -> MemorySampled:
    """A measurement of the device: services near what they hold, the workers' overhead,
    the device's own baseline and some foreign memory."""
    _, a, b, _ = op
    world = ex.manager.world
    per_service = {}
    for state in world.services.values():
        if state.holds_memory:
            held = world.ledger.service_total("gpu", state.name) - world.ledger.amount(
                "gpu", state.name, Category.RESERVED
            )
            per_service[state.name] = int(held * (0.8 + 0.1 * (a % 5)))
    overhead = (a % 7) * 100 * MIB
    baseline = (a % 3) * 64 * MIB
    foreign = int(b * 2 * GIB)
    used = sum(per_service.values()) + overhead + baseline + foreign
    return MemorySampled(
        device="gpu",
        used_bytes=used,
        per_service=per_service,
        baseline_bytes=baseline,
        overhead_bytes=overhead,
    )


def _check(ex: FakeExecutor, last: MemorySampled | None) -> None:
    snap = ex.manager.snapshot().as_dict()
    (dev,) = snap["devices"]
    picture = ledger_picture(snap)["gpu"]
    listed = [entry["category"] for entry in picture["breakdown"]]
    assert listed == [*LEDGER_CATEGORIES, *DEVICE_CATEGORIES]  # every category, once
    amounts = {entry["category"]: entry["bytes"] for entry in picture["breakdown"]}
    assert sum(amounts.values()) == dev["capacity_bytes"]  # to the byte
    assert amounts["available"] == dev["available_bytes"]  # the ledger's own figure
    assert amounts["overhead"] == dev["overhead_bytes"]
    if last is not None:  # the categories are what the sample said
        assert amounts["overhead"] == last.overhead_bytes
        managed = sum(last.per_service.values())
        expected = last.used_bytes - managed - last.baseline_bytes - last.overhead_bytes
        assert amounts["foreign"] == max(0, expected)
    assert any(line.startswith("gpu: capacity ") for line in why_full(snap)["lines"])


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    spec=manager_specs(),
    ops=ops_strategy,
    outside=st.integers(0, 4096),
)
def test_explain_categories_sum_to_the_device_capacity_for_any_events(
    spec: ManagerSpec, ops: list[Op], outside: int
) -> None:
    (device,) = spec.devices
    bigger = dataclasses.replace(device, capacity_bytes=device.budget_bytes + outside * MIB)
    spec = dataclasses.replace(spec, devices=(bigger,))
    ex = FakeExecutor(Manager(spec, make_policy("accelmux")))
    counter = [0]
    last: MemorySampled | None = None
    _check(ex, last)
    for op in ops:
        if op[0] == "sample":
            last = _sample(ex, op)
            ex.send(last, op[3])
        else:
            apply_op(ex, spec, op, counter)
        _check(ex, last)
