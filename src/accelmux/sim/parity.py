"""Hooks for the parity test between the simulator and the live runtime.

Both drive the same :class:`~accelmux.core.manager.Manager`; only the clock and the
executor differ. The simulator exposes:

- :func:`event_log`: the exact ``(time, event)`` sequence the simulator fed to the
  Manager for a scenario and seed (requests, load/unload completions, memory samples,
  ticks...);
- :func:`decision_log`: every action the Manager returned, as
  :meth:`~accelmux.core.manager.Decision.as_dict` rows (``t``, ``action``, ``service``,
  ``request_id``, ``reason``, ...);
- :func:`replay`: feed an event sequence to a fresh Manager (built from the same spec and
  policy) with a fake clock and return its decision rows. Replaying :func:`event_log`
  reproduces :func:`decision_log` exactly; the live runtime's parity test can feed the
  same events through its own driver (fake backends, fake clock) and compare.
"""

from __future__ import annotations

from typing import Any

from accelmux.core.events import Event
from accelmux.core.manager import Decision, Manager
from accelmux.core.specs import ManagerSpec
from accelmux.sim.baselines import make_policy
from accelmux.sim.executor import Simulation
from accelmux.sim.scenario import Scenario, load_scenario


def _simulation(
    scenario: Scenario | str,
    seed: int,
    *,
    policy: str | None,
    duration_s: float | None,
    trace_path: str | None,
) -> Simulation:
    scn = load_scenario(scenario) if isinstance(scenario, str) else scenario
    sim = Simulation(
        scn,
        policy or scn.config.policy.name,
        seed,
        duration_s=duration_s,
        trace_path=trace_path,
        record_decisions=True,
        record_events=True,
    )
    sim.run()
    return sim


def decision_log(
    scenario: Scenario | str,
    seed: int,
    *,
    policy: str | None = None,
    duration_s: float | None = None,
    trace_path: str | None = None,
) -> list[dict[str, Any]]:
    """Every decision of one simulated run (the policy defaults to the scenario's)."""
    sim = _simulation(scenario, seed, policy=policy, duration_s=duration_s, trace_path=trace_path)
    return sim.decisions


def event_log(
    scenario: Scenario | str,
    seed: int,
    *,
    policy: str | None = None,
    duration_s: float | None = None,
    trace_path: str | None = None,
) -> tuple[ManagerSpec, list[tuple[float, Event]]]:
    """The Manager's spec and the ``(time, event)`` inputs of one simulated run."""
    sim = _simulation(scenario, seed, policy=policy, duration_s=duration_s, trace_path=trace_path)
    return sim.spec, sim.events


def replay(
    spec: ManagerSpec, policy: str, events: list[tuple[float, Event]]
) -> list[dict[str, Any]]:
    """Feed ``events`` to a fresh Manager at their times; its decision rows."""
    manager = Manager(spec, make_policy(policy))
    rows = [Decision(0.0, a).as_dict() for a in manager.start(0.0)]
    for t, event in events:
        rows.extend(Decision(t, a).as_dict() for a in manager.handle(event, t))
    return rows
