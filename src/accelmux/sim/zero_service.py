"""Zero service: the longest stretch a class had work the device could hold and got none.

The starvation tracker (:mod:`accelmux.sim.starvation`) asks whether idle memory could
have held a waiting request at each sample. This asks a blunter question, one a user
notices: was there a stretch of simulated time in which a class kept asking for work that
fits the device and none of its work was served at all? A request rejected at once (a
``too_large`` that should not have been) is never waiting, so only this measure sees a
service locked out for the rest of a run.

For one class:

- a *demand* is the arrival of a measured request (after the warm-up) whose estimate fits
  the *empty* device: the service's weights and runtime, its KV pool (at least its
  floor, at most its ceiling, holding the request's KV) and the request's activations,
  within the device's usable budget (budget minus headroom). Requests that could never
  fit are left out: refusing them is right;
- the class is *served* from the moment one of its requests is first dispatched until it
  finishes, for every request that finished ``ok``;
- a stretch starts at a demand made while nothing of the class is served and ends when
  the class is next served (or at the end of the run).

:func:`zero_service` gives, per class label, the longest such stretch and when it began.
The target a policy is judged by (docs/benchmarks.md): no stretch longer than
:data:`ZERO_SERVICE_LIMIT_S`.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accelmux.sim.executor import RunOutput, SimRequest

#: Five simulated minutes: a class without any service for longer has been locked out.
ZERO_SERVICE_LIMIT_S = 300.0


def fits_empty_device(out: RunOutput, req: SimRequest, usable: dict[str, int]) -> bool:
    """Whether the request's estimate fits its device (``usable``: bytes per device)
    with nothing else on it."""
    spec = out.services[req.service]
    p = spec.profile
    pool = max(p.kv_floor, min(p.kv_ceiling, req.est_kv))  # as the starvation tracker
    need = p.weights + p.runtime + pool + req.est_active
    return need <= usable.get(spec.device, 0)


def _served(reqs: list[SimRequest]) -> list[tuple[float, float]]:
    """The merged spans in which some request of the class was being served."""
    spans = sorted(
        (r.first_dispatch_at, r.finished_at)
        for r in reqs
        if r.outcome == "ok" and r.first_dispatch_at is not None and r.finished_at is not None
    )
    merged: list[tuple[float, float]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def longest_gap(
    demands: list[float], served: list[tuple[float, float]], end: float
) -> tuple[float, float | None]:
    """(length, start) of the longest stretch from a demand outside every served span to
    the next served span's start (or ``end``); (0, None) when there is none."""
    starts = [s for s, _ in served]
    best, at = 0.0, None
    for t in sorted(demands):
        i = bisect.bisect_right(starts, t)
        if i and served[i - 1][1] >= t:
            continue  # the class is being served when this demand arrives
        until = starts[i] if i < len(starts) else end
        if until - t > best:
            best, at = until - t, t
    return best, at


def zero_service(out: RunOutput) -> dict[str, dict[str, Any]]:
    """Per class label with requests: the longest zero-service stretch (s) and its start."""
    usable = {d.name: d.usable_bytes for d in out.manager.spec.devices}
    by_class: dict[str, list[SimRequest]] = {}
    for req in out.requests.values():
        by_class.setdefault(req.cls.label, []).append(req)
    result: dict[str, dict[str, Any]] = {}
    for label, reqs in sorted(by_class.items()):
        demands = [
            r.arrived_at
            for r in reqs
            if r.arrived_at >= out.warmup_s and fits_empty_device(out, r, usable)
        ]
        length, at = longest_gap(demands, _served(reqs), out.duration_s)
        result[label] = {
            "longest_s": round(length, 3),
            "from_s": None if at is None else round(at, 3),
        }
    return result
