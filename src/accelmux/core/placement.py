"""Placement: on which device a service runs, and which replica serves a request.

A service that may run on several devices is one **replica** per device (``chat@gpu0``,
``chat@gpu1``). To the World each replica is an ordinary service, with its own ledger
accounts, queue, residency and calibration; requests address the **group** (``chat``).
When a request arrives the policy routes it to one replica (``Policy.route``), and that
is where placement and replication are decided: routing to a replica that is not loaded
makes the policy load it there, beside or instead of the others.

A pinned service is never evicted, so it is placed once, before the first event, by
:func:`place_pinned` (pinned services packed together); its other replicas are warm ones for peaks.

Pure functions only: no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from accelmux.core.specs import ManagerSpec, ServiceSpec
from accelmux.core.types import ServiceStatus
from accelmux.core.world import ServiceState

REPLICA_SEPARATOR = "@"


def replica_name(group: str, device: str) -> str:
    """The name of ``group``'s replica on ``device``."""
    return f"{group}{REPLICA_SEPARATOR}{device}"


def place_pinned(
    room: Mapping[str, int], pinned: Iterable[tuple[str, int, Sequence[str]]]
) -> dict[str, str]:
    """The device of each pinned group: best fit decreasing (``room``: usable bytes per
    device).

    ``pinned``: (group, resident bytes, candidate devices in config order). The largest
    group goes first, onto the candidate with the least room left that still holds it
    (with none, the one with the most room). Pinned services are packed together, so
    the other devices keep room in one piece for the large models that come and go (a
    voice chain stays on one device). Ties go to the earlier candidate, so the result
    does not depend on the order the groups come in.
    """
    left = dict(room)
    placed: dict[str, str] = {}
    for group, size, candidates in sorted(pinned, key=lambda p: (-p[1], p[0])):
        holding = [d for d in candidates if left.get(d, 0) >= size]
        if holding:
            best = min(holding, key=lambda d: (left.get(d, 0), candidates.index(d)))
        else:
            best = max(candidates, key=lambda d: (left.get(d, 0), -candidates.index(d)))
        placed[group] = best
        left[best] = left.get(best, 0) - size
    return placed


def first_up(replicas: Sequence[ServiceState]) -> ServiceState:
    """The routing of a policy that does not place: the replica that is loaded (or
    loading), else the first listed. It never keeps two replicas of one service up."""
    for state in (ServiceStatus.LOADED, ServiceStatus.LOADING):
        for r in replicas:
            if r.status is state:
                return r
    return replicas[0]


def without_replicas(spec: ManagerSpec) -> ManagerSpec:
    """``spec`` with each service on the first device it may run on, under its own name:
    what a policy that does not place (no ``route``) runs, instead of loading every
    replica. Give such a policy a hand placement (``device:`` per service) to compare."""
    services: list[ServiceSpec] = []
    seen: set[str] = set()
    for s in spec.services:
        if not s.group:
            services.append(s)
        elif s.group not in seen:
            seen.add(s.group)
            services.append(dataclasses.replace(s, name=s.group, group=""))
    return dataclasses.replace(spec, services=tuple(services))
