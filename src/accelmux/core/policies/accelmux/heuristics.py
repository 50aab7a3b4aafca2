"""The policy's heuristics: the switches that turn each one off (ablation) and the
numeric constants they use, in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from accelmux.core.switches import DESCRIPTIONS, Switch

#: The policy's heuristics by name, each of which ``policy.disable`` can turn off (for
#: ablation: what each one buys is measured by running without it). The names are
#: :class:`~accelmux.core.switches.Switch`.
HEURISTICS: dict[str, str] = {s.value: DESCRIPTIONS[s] for s in Switch}


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

    host_realtime_grace_s: float = 0.25
    """Seconds batch and background work stay held after a realtime request ends, on a
    device whose compute every model shares (a host: CPU cores or shared memory), where
    ``policy.realtime_grace_s`` is not set: the next step of a voice chain follows within
    a client's round trip, and anything started in the gap slows it in proportion. On a
    discrete accelerator the hold spans the requests themselves (a grace there moved no
    voice request and shifted when batch work found room)."""

    restore_grace_s: float = 1.0
    """Idle seconds after which an on-demand service goes when it holds the memory of an
    evicted warm service that is likely to be used again (restore it sooner)."""


#: The constants the policy runs with.
TUNING = Tuning()
