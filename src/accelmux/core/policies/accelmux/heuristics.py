"""The policy's heuristics: the switches that turn each one off (ablation) and the
numeric constants they use, in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The policy's heuristics by name, each of which ``policy.disable`` can turn off (for
#: ablation: what each one buys is measured by running without it).
HEURISTICS: dict[str, str] = {
    "realtime_reserve": "keep the next activation of each loaded realtime service free "
    "of resident memory and of lower-class leases",
    "realtime_hold": "start no batch or background work on a device while realtime work "
    "runs or waits there",
    "batch_yield": "batch work yields compute to running interactive requests",
    "preemption": "stop (and re-queue) running lower-class work to make room",
    "preemption_bound": "a request preempted MAX_PREEMPTIONS times is no longer preemptible",
    "evict_after_preemption": "a service whose running work is all preempted to make room "
    "counts as a victim too: it is evicted once idle (a busy batch model gives way to an "
    "interactive one, not only its leases)",
    "ballooning": "shrink elastic KV pools when idle and to make room",
    "victim_scoring": "evict by reload cost x reuse probability x class weight per byte "
    "(off: least recently used first)",
    "single_victim": "when one victim covers the shortfall, evict the cheapest such one",
    "lower_class_first": "evict services of a strictly lower class than the requester's "
    "while they can cover the shortfall; its own class goes only when they cannot (a voice "
    "request must not evict the next step of its own chain while a chat model sits idle)",
    "cache_reuse": "a service's own allocator cache counts as room for its requests",
    "cache_accounting": "a service measured caching freed memory keeps what its finished "
    "or preempted requests held (charged to it until a sample or its unload): preempting "
    "it frees nothing until it unloads, so it is evicted, or others yield",
    "degrade_to_raw": "when only the calibration margin does not fit, run on the estimate "
    "scaled by the worst measured ratio, without margin (off: reject as too large)",
    "calibration": "scale estimates by the worst recent observed/estimated ratio "
    "(off: the safety factor alone)",
    "failure_calibration": "a crash with requests in flight, a load out of memory, or "
    "running requests measured above their leases, raises the service's calibration at once",
    "pressure_charging": "memory measured above what was accounted is charged to the "
    "service using it: it runs one request at a time and gives its own work back first",
    "fair_progress": "work a waiting higher class could preempt still loads and runs in "
    "idle memory (it takes memory from no one)",
    "on_demand_keep": "an idle on-demand service stays loaded past on_demand_ttl_s while "
    "its device's memory is not wanted (it is evicted first when it is)",
    "idle_keep": "an idle service stays loaded past its ttl_s while its device has memory "
    "to spare: nothing waits for memory there and more than the realtime reserve plus the "
    "spare fraction of the budget is free (its TTL applies again once less is); a realtime "
    "service always (only a realtime request evicts it, when lower classes cannot make "
    "the room)",
    "restore": "a warm service evicted for a short on-demand job is restored as soon as "
    "that job's service goes idle",
    "prewarm": "load warm services at start and reload likely-reused evicted ones into "
    "spare memory",
    "pause": "running LLM requests whose backend can pause are paused (their KV parked) "
    "instead of preempted: nothing is lost or redone when they resume",
    "time_share": "an LLM request waiting for its first token may pause the running "
    "streams of another model of its class (after TIME_SHARE_MIN_RUN_S of theirs) so "
    "that their model unloads to host RAM and its own loads: models switch between "
    "tokens instead of a request waiting out a whole answer; a paused stream may do the "
    "same after TIME_SHARE_QUANTUM_S of theirs",
    "first_token_pause": "a new request of a model at its concurrency limit pauses the "
    "stream of that model that has run longest (at least TIME_SHARE_MIN_RUN_S): it gets "
    "its first token now, the paused stream resumes at the next free slot",
    "realtime_yield": "while realtime work runs or waits on a device, interactive LLM "
    "streams there that can pause are paused between tokens (their KV kept in place) and "
    "new ones wait: the realtime work gets the compute, the streams resume after it",
    "reserve_fallback": "when the full realtime reserve would keep a lower-class load or "
    "request out for good although it fits the device, one realtime activation is kept "
    "free instead",
    "reserve_lending": "the realtime reserve may be held by services below realtime that one "
    "unload each gives back: idle ones, and ones running only work realtime preempts (a "
    "voice request then waits for an unload, not for another model's request to end); only "
    "the rest of it must be free",
    "serial_loads": "once a load has run out of memory on a device, loads there go one at "
    "a time: the next waits until the one in flight is done and measured",
    "placement": "a request for a service with replicas on several devices goes to the "
    "replica expected to start it soonest: a free loaded one, else the shortest queue or a "
    "load where memory is free or held by idle services (a second replica of a busy "
    "service loads when that is sooner than its queue); off: the replica that is up",
    "park_weights": "an unloaded model keeps its weights in host RAM (parked or sleeping, "
    "as its backend declares) within the host budget; victims are scored by the reload "
    "cost of the tier they land in",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Tuning:
    """The numeric constants of the policy's heuristics (fixed: the ablation switches
    turn a heuristic off, these say how much of it there is)."""

    max_preemptions: int = 3
    """A request is preempted at most this many times; after that it is no longer
    preemptible (by higher classes, foreign pressure or its own over-use) and runs to its
    end. Preemption thus cannot livelock: every preemption brings a request closer to it."""

    max_pauses: int = 4
    """A request is paused for time sharing at most this many times (each pause costs it
    only time between two tokens: its output so far and its KV state are kept)."""

    time_share_min_run_s: float = 1.0
    """Seconds a stream runs before a request of another model waiting for its first
    token may pause it (its own first token is out by then)."""

    time_share_quantum_s: float = 5.0
    """Seconds a stream runs before a paused stream may pause it in turn (a quantum:
    models do not switch back and forth faster)."""

    excess_tolerance: int = 16 * 1024 * 1024
    """Bytes of activation memory measured above what was accounted that are noise."""

    restore_retry_s: float = 30.0
    """A restore that evicted others for its room, and found the room taken by demand
    when the evictions were done, evicts for it again only after this long: a
    speculative reload never livelocks with the work it displaces."""

    restore_grace_s: float = 1.0
    """Idle seconds after which an on-demand service goes when it holds the memory of an
    evicted warm service that is likely to be used again (restore it sooner)."""


#: The constants the policy runs with.
TUNING = Tuning()
