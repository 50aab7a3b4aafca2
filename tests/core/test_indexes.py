"""Property tests of the World's indexes and of the rounds that rely on them.

After any event sequence the indexes (services by status, in flight, queued, kept,
evicted; waiting requests by cause and class; the deadline heap; the ledger's totals)
equal a recomputation from scratch, for every policy. And the accelmux policy, which
skips requests and devices whose decisions would repeat, decides exactly as a test
double that considers every waiting request in every round.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelmux.core.manager import Manager
from accelmux.core.policies.accelmux import HEURISTICS, AccelmuxPolicy
from accelmux.core.policy import Policy
from accelmux.core.specs import DeviceSpec, ManagerSpec
from accelmux.sim.baselines import make_policy

from .fake_executor import FakeExecutor
from .test_properties import SETTINGS, Op, apply_op, manager_specs, ops_strategy
from .world_oracle import check_indexes

POLICIES = ("accelmux", "independent", "static", "ollama+containers", "llama-swap", "oracle")


def ExhaustiveAccelmux() -> AccelmuxPolicy:
    """The accelmux policy without any skipping, every request every round (its round
    cache off)."""
    return AccelmuxPolicy(cache=False)


@st.composite
def two_device_specs(draw: st.DrawFn) -> ManagerSpec:
    """A random spec whose odd services sit on a second device of their own budget."""
    spec = draw(manager_specs())
    first = spec.devices[0]
    budget = draw(st.integers(4, 24)) * 1024**3
    second = DeviceSpec(
        name="gpu2",
        kind="virtual",
        capacity_bytes=budget,
        budget_bytes=budget,
        headroom_bytes=first.headroom_bytes,
    )
    services = tuple(replace(s, device="gpu2") if i % 2 else s for i, s in enumerate(spec.services))
    return replace(spec, devices=(first, second), services=services)


def drive(spec: ManagerSpec, policy: Policy, ops: list[Op], check: bool) -> FakeExecutor:
    ex = FakeExecutor(Manager(spec, policy))
    counter = [0]
    for op in ops:
        apply_op(ex, spec, op, counter)
        if check:
            assert_indexes_match(ex)
    return ex


def assert_indexes_match(ex: FakeExecutor) -> None:
    world = ex.manager.world
    check_indexes(world)
    deadlines = [r.deadline_at for r in world.waiting.values() if r.deadline_at > ex.now]
    expected = min(deadlines) if deadlines else None
    assert world.next_deadline(ex.now) == expected


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
@SETTINGS
@given(spec=st.one_of(manager_specs(), two_device_specs()), ops=ops_strategy)
def test_indexes_equal_a_recomputation(policy: str, spec: ManagerSpec, ops: list[Op]) -> None:
    ex = drive(spec, make_policy(policy), ops, check=True)
    ex.settle()
    assert_indexes_match(ex)


@pytest.mark.slow
@SETTINGS
@given(
    spec=st.one_of(manager_specs(), two_device_specs()),
    ops=ops_strategy,
    disabled=st.frozensets(st.sampled_from(sorted(HEURISTICS))),
    grace=st.sampled_from([0.0, 2.0]),
)
def test_skipping_rounds_decides_like_considering_everything(
    spec: ManagerSpec, ops: list[Op], disabled: frozenset[str], grace: float
) -> None:
    # Every heuristic switch (``policy.disable``) and the realtime grace change what the
    # rounds read.
    knobs = replace(spec.knobs, disabled=disabled, realtime_grace_s=grace)
    spec = replace(spec, knobs=knobs)
    skipping = AccelmuxPolicy()
    skipping.few_waiting = 0  # skip whatever it can, however short the queue
    fast = drive(spec, skipping, ops, check=False)
    full = drive(spec, ExhaustiveAccelmux(), ops, check=False)
    assert fast.actions == full.actions
    assert [d.as_dict() for d in fast.manager.log] == [d.as_dict() for d in full.manager.log]
