"""The accelmux policy.

Admission is against ``budget - headroom - foreign - committed`` with calibrated
estimates. When a request does not fit, memory is taken back in order of cost:

1. shrink elastic KV pools of other services down to their floor (or what is in use);
2. preempt running batch/background requests of a lower class (they are re-queued);
3. evict idle, unpinned services of an equal or lower class, lowest victim score first:
   ``reload_seconds x P(reuse within horizon) x class_weight / bytes_freed``; the
   requester's own class only when strictly lower classes cannot cover the shortfall.

If that cannot make room the request waits (bounded queue, deadline) or is rejected with
a reason and Retry-After. Realtime work is protected three times: requests are scheduled
in class order; while a realtime request runs or waits on a device, no new batch or
background work starts there (it would steal compute), nor, on a host device (shared
compute), for the realtime grace after one ends (the next step of a voice chain
follows at once: ``facts.realtime_grace``); and a *realtime reserve* (the
largest activation seen per loaded realtime service) is kept free of resident memory
and of non-preemptible leases of lower classes, while on-demand non-LLM jobs (an image)
may overlap it because realtime work preempts them. Batch work also yields compute to
running interactive requests. Batch services run inside their maintenance windows, and
outside them only with spare memory and no higher class waiting.

Residency: an eviction counts the allocator cache it frees; when one victim covers the
shortfall the cheapest such one goes (not the largest). At start, warm services are
loaded into memory nobody needs yet; a warm service evicted for a short on-demand job
is restored as soon as that job's service goes idle (``RESTORE_GRACE_S``), taking memory
back from batch and background work if it has to. When only the calibration margin of a
request does not fit the device, it runs on its estimate scaled by what was measured so
far (the headroom covers the margin).

When estimates are wrong: a request is preempted at most ``MAX_PREEMPTIONS`` times; a
crash with requests in flight, or a sample measuring running requests above their
leases, raises the service's calibration at once; memory measured above the leases is
charged to the service using it (one request at a time, its own work given back first);
and work a waiting higher class could preempt still runs in idle memory (fair progress).
Each heuristic has a name in ``HEURISTICS`` and can be turned off (``policy.disable``).
"""

from __future__ import annotations

from accelmux.core.policies.accelmux.heuristics import HEURISTICS, TUNING, Tuning
from accelmux.core.policies.accelmux.policy import AccelmuxPolicy, Parts, build_parts

# The constants by their former names (``TUNING`` holds them).
MAX_PREEMPTIONS = TUNING.max_preemptions
MAX_PAUSES = TUNING.max_pauses
TIME_SHARE_MIN_RUN_S = TUNING.time_share_min_run_s
TIME_SHARE_QUANTUM_S = TUNING.time_share_quantum_s
EXCESS_TOLERANCE = TUNING.excess_tolerance
RESTORE_RETRY_S = TUNING.restore_retry_s
RESTORE_GRACE_S = TUNING.restore_grace_s

__all__ = [
    "EXCESS_TOLERANCE",
    "HEURISTICS",
    "MAX_PAUSES",
    "MAX_PREEMPTIONS",
    "RESTORE_GRACE_S",
    "RESTORE_RETRY_S",
    "TIME_SHARE_MIN_RUN_S",
    "TIME_SHARE_QUANTUM_S",
    "TUNING",
    "AccelmuxPolicy",
    "Parts",
    "Tuning",
    "build_parts",
]
