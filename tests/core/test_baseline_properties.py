"""The baselines' defining rules hold for any event sequence (hypothesis).

The same random homes and event streams as ``test_properties`` (without admin commands,
which act outside any policy), driven through the test double of the executor that
checks every action is legal.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelmux.core.actions import Unload
from accelmux.core.manager import Manager
from accelmux.core.specs import ManagerSpec
from accelmux.core.types import Reason, Residency, ServiceStatus
from accelmux.sim.baselines import make_policy
from accelmux.sim.baselines.policies import (
    BaselineSettings,
    LlamaSwapPolicy,
    LlamaSwapSettings,
    OllamaContainersPolicy,
    OllamaSettings,
    resolve_groups,
)

from .fake_executor import FakeExecutor
from .test_properties import Op, apply_op, manager_specs, ops_strategy

#: Fewer examples than the accelmux property tests: these check a few rules per step.
SETTINGS = settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
POLICY_OPS = ops_strategy.map(lambda ops: [op for op in ops if op[0] not in ("admin", "shutdown")])


def _drive(
    spec: ManagerSpec,
    name: str,
    settings: BaselineSettings,
    ops: list[Op],
    check: Callable[[FakeExecutor], None],
) -> FakeExecutor:
    """Apply ``ops`` one by one and ``check`` after each (not the ledger's budget: the
    baselines do not keep it, the simulator's physical model judges them)."""
    ex = FakeExecutor(Manager(spec, make_policy(name, settings)))
    counter = [0]
    check(ex)
    for op in ops:
        apply_op(ex, spec, op, counter)  # the double checks each action is legal
        check(ex)
    return ex


@pytest.mark.slow
@SETTINGS
@given(
    spec=manager_specs(),
    ops=POLICY_OPS,
    cap=st.sampled_from([1, 2, 3]),
    forever=st.booleans(),
)
def test_ollama_rules_hold(spec: ManagerSpec, ops: list[Op], cap: int, forever: bool) -> None:
    settings = BaselineSettings(
        ollama=OllamaSettings(max_loaded_models=cap, pinned_forever=forever)
    )

    def check(ex: FakeExecutor) -> None:
        policy = ex.manager.policy
        assert isinstance(policy, OllamaContainersPolicy)
        own = [s for s in ex.manager.world.services.values() if policy.hosts(s)]
        assert sum(s.holds_memory for s in own) <= cap  # only its own models count
        assert sum(s.status is ServiceStatus.LOADING for s in own) <= 1  # one load at a time

    ex = _drive(spec, "ollama+containers", settings, ops, check)
    pinned = {s.name for s in spec.services if s.residency is Residency.PINNED}
    for action in ex.actions:
        if forever and isinstance(action, Unload) and action.service in pinned:
            assert action.reason is not Reason.TTL_EXPIRED  # keep_alive -1 never expires


@SETTINGS
@given(spec=manager_specs(), ops=POLICY_OPS)
def test_llama_swap_rules_hold(spec: ManagerSpec, ops: list[Op]) -> None:
    settings = BaselineSettings(llama_swap=LlamaSwapSettings())
    group_of = resolve_groups(list(spec.services), settings.llama_swap.groups)

    def check(ex: FakeExecutor) -> None:
        policy = ex.manager.policy
        assert isinstance(policy, LlamaSwapPolicy)
        world = ex.manager.world
        swapping: dict[str, int] = {}
        for s in world.services.values():
            if policy.hosts(s) and group_of[s.name].swap and s.holds_memory:
                swapping[group_of[s.name].name] = swapping.get(group_of[s.name].name, 0) + 1
        assert all(n <= 1 for n in swapping.values())  # one model per swap group

    ex = _drive(spec, "llama-swap", settings, ops, check)
    persistent = {n for n, g in group_of.items() if g.persistent}
    unloads = [a for a in ex.actions if isinstance(a, Unload) and a.service in persistent]
    assert not unloads  # the persistent group never swaps out
