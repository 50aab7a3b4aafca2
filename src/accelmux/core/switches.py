"""The names of the accelmux policy's heuristics that can be turned off (ablation).

One definition, checked wherever a name comes in: ``policy.disable`` in the
configuration, ``accelmux[disable=[...]]`` variants and
:class:`~accelmux.core.specs.PolicyKnobs` at construction. The policy reads them as
:class:`Switches`, a frozen record of booleans built once per spec: a misspelt switch is
an attribute error mypy reports, never a string that silently reads "on".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from enum import StrEnum


class Switch(StrEnum):
    """A heuristic of the accelmux policy, by the name ``policy.disable`` uses."""

    REALTIME_RESERVE = "realtime_reserve"
    REALTIME_HOLD = "realtime_hold"
    BATCH_YIELD = "batch_yield"
    PREEMPTION = "preemption"
    PREEMPTION_BOUND = "preemption_bound"
    EVICT_AFTER_PREEMPTION = "evict_after_preemption"
    BALLOONING = "ballooning"
    VICTIM_SCORING = "victim_scoring"
    SINGLE_VICTIM = "single_victim"
    LOWER_CLASS_FIRST = "lower_class_first"
    CACHE_REUSE = "cache_reuse"
    CACHE_ACCOUNTING = "cache_accounting"
    DEGRADE_TO_RAW = "degrade_to_raw"
    CALIBRATION = "calibration"
    FAILURE_CALIBRATION = "failure_calibration"
    PRESSURE_CHARGING = "pressure_charging"
    FAIR_PROGRESS = "fair_progress"
    ON_DEMAND_KEEP = "on_demand_keep"
    IDLE_KEEP = "idle_keep"
    RESTORE = "restore"
    PREWARM = "prewarm"
    PAUSE = "pause"
    TIME_SHARE = "time_share"
    FIRST_TOKEN_PAUSE = "first_token_pause"
    REALTIME_YIELD = "realtime_yield"
    RESERVE_FALLBACK = "reserve_fallback"
    RESERVE_LENDING = "reserve_lending"
    SERIAL_LOADS = "serial_loads"
    PLACEMENT = "placement"
    PARK_WEIGHTS = "park_weights"
    REALTIME_UNPIN = "realtime_unpin"


#: What each heuristic does (one line each; what turning it off loses).
DESCRIPTIONS: dict[Switch, str] = {
    Switch.REALTIME_RESERVE: "keep the next activation of each loaded realtime service free "
    "of resident memory and of lower-class leases",
    Switch.REALTIME_HOLD: "start no batch or background work on a device while realtime work "
    "runs or waits there (a steady service's frames only where they share its compute)",
    Switch.BATCH_YIELD: "batch work yields compute to running interactive requests; "
    "background work (not steady) runs one request per service beside them",
    Switch.PREEMPTION: "stop (and re-queue) running lower-class work to make room",
    Switch.PREEMPTION_BOUND: "a request preempted MAX_PREEMPTIONS times is no longer preemptible",
    Switch.EVICT_AFTER_PREEMPTION: "a service whose running work is all preempted to make room "
    "counts as a victim too: it is evicted once idle (a busy batch model gives way to an "
    "interactive one, not only its leases)",
    Switch.BALLOONING: "shrink elastic KV pools when idle and to make room",
    Switch.VICTIM_SCORING: "evict by reload cost x reuse probability x class weight per byte "
    "(off: least recently used first)",
    Switch.SINGLE_VICTIM: "when one victim covers the shortfall, evict the cheapest such one",
    Switch.LOWER_CLASS_FIRST: "evict services of a strictly lower class than the requester's "
    "while they can cover the shortfall; its own class goes only when they cannot (a voice "
    "request must not evict the next step of its own chain while a chat model sits idle)",
    Switch.CACHE_REUSE: "a service's own allocator cache counts as room for its requests",
    Switch.CACHE_ACCOUNTING: "a service measured caching freed memory keeps what its finished "
    "or preempted requests held (charged to it until a sample or its unload): preempting "
    "it frees nothing until it unloads, so it is evicted, or others yield",
    Switch.DEGRADE_TO_RAW: "when only the calibration margin does not fit, run on the estimate "
    "scaled by the worst measured ratio, without margin (off: reject as too large)",
    Switch.CALIBRATION: "scale estimates by the worst recent observed/estimated ratio "
    "(off: the safety factor alone)",
    Switch.FAILURE_CALIBRATION: "a crash with requests in flight, a load out of memory, or "
    "running requests measured above their leases, raises the service's calibration at once",
    Switch.PRESSURE_CHARGING: "memory measured above what was accounted is charged to the "
    "service using it: it runs one request at a time and gives its own work back first",
    Switch.FAIR_PROGRESS: "work a waiting higher class could preempt still loads and runs in "
    "idle memory (it takes memory from no one)",
    Switch.ON_DEMAND_KEEP: "an idle on-demand service stays loaded past on_demand_ttl_s while "
    "its device's memory is not wanted (it is evicted first when it is)",
    Switch.IDLE_KEEP: "an idle service stays loaded past its ttl_s while its device has memory "
    "to spare: nothing waits for memory there and more than the realtime reserve plus the "
    "spare fraction of the budget is free (its TTL applies again once less is); a realtime "
    "service always (only a realtime request evicts it, when lower classes cannot make "
    "the room)",
    Switch.RESTORE: "a warm service evicted for a short on-demand job is restored as soon as "
    "that job's service goes idle",
    Switch.PREWARM: "load warm services at start and reload likely-reused evicted ones into "
    "spare memory",
    Switch.PAUSE: "running LLM requests whose backend can pause are paused (their KV parked) "
    "instead of preempted: nothing is lost or redone when they resume",
    Switch.TIME_SHARE: "an LLM request waiting for its first token may pause the running "
    "streams of another model of its class (after TIME_SHARE_MIN_RUN_S of theirs) so "
    "that their model unloads to host RAM and its own loads: models switch between "
    "tokens instead of a request waiting out a whole answer; a paused stream may do the "
    "same after TIME_SHARE_QUANTUM_S of theirs",
    Switch.FIRST_TOKEN_PAUSE: "a new request of a model at its concurrency limit pauses the "
    "stream of that model that has run longest (at least TIME_SHARE_MIN_RUN_S): it gets "
    "its first token now, the paused stream resumes at the next free slot",
    Switch.REALTIME_YIELD: "while realtime work runs or waits on a device, interactive LLM "
    "streams there that can pause are paused between tokens (their KV kept in place) and "
    "new ones wait: the realtime work gets the compute, the streams resume after it",
    Switch.RESERVE_FALLBACK: "when the full realtime reserve would keep a lower-class load or "
    "request out for good although it fits the device, one realtime activation is kept "
    "free instead",
    Switch.RESERVE_LENDING: "the realtime reserve may be held by services below realtime that one "
    "unload each gives back: idle ones, and ones running only work realtime preempts (a "
    "voice request then waits for an unload, not for another model's request to end); only "
    "the rest of it must be free",
    Switch.SERIAL_LOADS: "once a load has run out of memory on a device, loads there go one at "
    "a time: the next waits until the one in flight is done and measured",
    Switch.PLACEMENT: "a request for a service with replicas on several devices goes to the "
    "replica expected to start it soonest: a free loaded one, else the shortest queue or a "
    "load where memory is free or held by idle services (a second replica of a busy "
    "service loads when that is sooner than its queue); off: the replica that is up",
    Switch.PARK_WEIGHTS: "an unloaded model keeps its weights in host RAM (parked or sleeping, "
    "as its backend declares) within the host budget; victims are scored by the reload "
    "cost of the tier they land in",
    Switch.REALTIME_UNPIN: "a realtime request that no other room could serve (a foreign "
    "program took the memory the pinned services were sized for) may evict idle pinned "
    "services, lower classes first, only those whose reload keeps their own objective "
    "unless realtime work there went unserved for 120 s; they are reloaded when room "
    "returns (off: the request is refused while the pinned services sit idle)",
}

#: Every switch name, as plain strings.
SWITCH_NAMES: frozenset[str] = frozenset(s.value for s in Switch)


def unknown_switches(names: Iterable[str]) -> list[str]:
    """The names among ``names`` that are no switch, in their order."""
    return [n for n in names if n not in SWITCH_NAMES]


def unknown_switch_message(unknown: Iterable[str]) -> str:
    """The error for unknown switch names: they, and every known one."""
    return (
        f"unknown heuristic(s) {', '.join(repr(n) for n in unknown)}; "
        f"known: {', '.join(sorted(SWITCH_NAMES))}"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Switches:
    """Which heuristics are on: one boolean per :class:`Switch`, by its name (built once
    per spec by :meth:`from_disabled`; ``tests/core/test_switches.py`` keeps the two in
    step)."""

    realtime_reserve: bool = True
    realtime_hold: bool = True
    batch_yield: bool = True
    preemption: bool = True
    preemption_bound: bool = True
    evict_after_preemption: bool = True
    ballooning: bool = True
    victim_scoring: bool = True
    single_victim: bool = True
    lower_class_first: bool = True
    cache_reuse: bool = True
    cache_accounting: bool = True
    degrade_to_raw: bool = True
    calibration: bool = True
    failure_calibration: bool = True
    pressure_charging: bool = True
    fair_progress: bool = True
    on_demand_keep: bool = True
    idle_keep: bool = True
    restore: bool = True
    prewarm: bool = True
    pause: bool = True
    time_share: bool = True
    first_token_pause: bool = True
    realtime_yield: bool = True
    reserve_fallback: bool = True
    reserve_lending: bool = True
    serial_loads: bool = True
    placement: bool = True
    park_weights: bool = True
    realtime_unpin: bool = True

    @classmethod
    def from_disabled(cls, disabled: Iterable[str]) -> Switches:
        """Every switch on but those named in ``disabled`` (each a :class:`Switch`)."""
        off = frozenset(disabled)
        unknown = unknown_switches(sorted(off))
        if unknown:
            raise ValueError(unknown_switch_message(unknown))
        return cls(**{f.name: f.name not in off for f in fields(cls)})
