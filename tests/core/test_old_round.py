"""The rebuilt round decides exactly as the round before the rebuild.

``tests/core/old_round`` is a copy of the core's round as it was before ``core/world/``
and the parts as classes (its World, its Manager and the accelmux policy's parts wired
through one class). Both are driven here with the same random event streams (specs of
one or two devices, crowded queues, every heuristic switched off at random, a realtime
grace or none, clients' keep_alives) and must return the same actions, ask for the same
wake-ups and log the same decisions. The copy goes when this test does.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accelmux.core.events import Tick
from accelmux.core.manager import Manager
from accelmux.core.policies.accelmux import HEURISTICS, AccelmuxPolicy
from accelmux.core.specs import ManagerSpec

from .fake_executor import FakeExecutor
from .old_round.accelmux import AccelmuxPolicy as OldAccelmuxPolicy
from .old_round.manager import Manager as OldManager
from .test_indexes import two_device_specs
from .test_properties import SETTINGS, Op, manager_specs, ops_strategy
from .test_round_cache import apply, crowded_ops, crowded_specs


def drive(ex: FakeExecutor, spec: ManagerSpec, ops: list[Op]) -> list[float | None]:
    """Apply ``ops``; after each, ask for the wake-up and sometimes tick at it."""
    counter = [0]
    wakes: list[float | None] = []
    for op in ops:
        apply(ex, spec, op, counter)
        wake = ex.manager.next_wakeup(ex.now)
        wakes.append(wake)
        if wake is not None and op[2] < 0.3:
            ex.send(Tick(), wake - ex.now)  # the policy's own wake-up, not the deadlines
            wakes.append(ex.manager.next_wakeup(ex.now))
    return wakes


def assert_same_round(spec: ManagerSpec, ops: list[Op], few_waiting: int | None) -> None:
    new_policy, old_policy = AccelmuxPolicy(), OldAccelmuxPolicy()
    if few_waiting is not None:  # 0: no short-queue path, every skip is taken
        new_policy.few_waiting = old_policy.few_waiting = few_waiting
    new = FakeExecutor(Manager(spec, new_policy))
    old = FakeExecutor(OldManager(spec, old_policy))  # type: ignore[arg-type]
    new_wakes = drive(new, spec, ops)
    old_wakes = drive(old, spec, ops)
    assert new.actions == old.actions
    assert new_wakes == old_wakes
    assert [d.as_dict() for d in new.manager.log] == [d.as_dict() for d in old.manager.log]


specs = st.one_of(manager_specs(), two_device_specs(), crowded_specs())
knobs = {
    "disabled": st.frozensets(st.sampled_from(sorted(HEURISTICS))),
    "grace": st.sampled_from([0.0, 2.0]),
    "few_waiting": st.sampled_from([None, 0]),
}


@settings(SETTINGS, max_examples=40)
@given(spec=specs, ops=st.one_of(ops_strategy, crowded_ops), **knobs)
def test_the_new_round_decides_as_the_old_one(
    spec: ManagerSpec,
    ops: list[Op],
    disabled: frozenset[str],
    grace: float,
    few_waiting: int | None,
) -> None:
    spec = replace(spec, knobs=replace(spec.knobs, disabled=disabled, realtime_grace_s=grace))
    assert_same_round(spec, ops, few_waiting)


@pytest.mark.slow
@settings(SETTINGS, max_examples=400)
@given(spec=specs, ops=st.one_of(ops_strategy, crowded_ops), **knobs)
def test_the_new_round_decides_as_the_old_one_at_length(
    spec: ManagerSpec,
    ops: list[Op],
    disabled: frozenset[str],
    grace: float,
    few_waiting: int | None,
) -> None:
    spec = replace(spec, knobs=replace(spec.knobs, disabled=disabled, realtime_grace_s=grace))
    assert_same_round(spec, ops, few_waiting)
