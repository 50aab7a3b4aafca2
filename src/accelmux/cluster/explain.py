"""Why the gateway sent a request where it did: ``GET /admin/explain/{id}``.

For each request it routes, the gateway keeps (for the last :data:`KEPT` requests) the
routing index it decided from, its own requests in flight for that model's hosts at
that moment, and every attempt: the node, what it answered, how long it took. The record
is found by the request's id (the ``X-Request-Id`` the chosen node answered with, or the
gateway's own when no node answered), and by each attempt's node id. It is turned into
words only when asked: the nodes considered with their free and freeable memory, their
readiness and expected wait, and why the first one was chosen.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from accelmux.core.routing import (
    Readiness,
    RouteIndex,
    ServiceOnNode,
    expected_wait_s,
    rank,
    readiness,
)

#: How many requests' records are kept.
KEPT = 2000
GIB = 1024**3

WHY = {
    Readiness.IDLE: "loaded there with a free slot",
    Readiness.BUSY: "loaded there, its slots busy: waits its turn",
    Readiness.FITS: "not loaded; fits in the free memory there",
    Readiness.FREES: "not loaded; fits once idle services there are evicted",
    Readiness.BLOCKED: "not loaded; the memory it needs is held by busy services there",
    Readiness.BACKING_OFF: "crashed there; waits for its restart",
}


@dataclass
class Attempt:
    node: str
    status: int | None = None
    code: str | None = None
    request_id: str | None = None
    took_s: float | None = None
    outcome: str = "sent"


@dataclass
class Record:
    model: str
    index: RouteIndex
    pending: dict[tuple[str, str], int]
    at: float = field(default_factory=time.time)
    attempts: list[Attempt] = field(default_factory=list)

    def as_dict(self, request_id: str) -> dict[str, Any]:
        considered = []
        for _, node, svc in self.index.candidates.get(self.model, ()):
            considered.append(_candidate(node, svc, self.pending.get((node, svc.service), 0)))
        considered.sort(key=lambda c: c["rank"])
        for i, entry in enumerate(considered):
            entry["rank"] = i + 1
        lost = self.index.lost.get(self.model)
        chosen = next((a.node for a in self.attempts if a.outcome == "answered"), None)
        return {
            "request_id": request_id,
            "model": self.model,
            "time": self.at,
            "considered": considered,
            "down": list(lost[0]) if lost else [],
            "attempts": [vars(a) for a in self.attempts],
            "chosen": chosen,
            "why": _why(considered, self.attempts, chosen),
        }


def _candidate(node: str, svc: ServiceOnNode, pending: int) -> dict[str, Any]:
    ready = readiness(svc, pending)
    return {
        "node": node,
        "service": svc.service,
        "rank": rank(svc, node, pending),
        "readiness": ready.name.lower(),
        "expected_wait_s": round(expected_wait_s(svc, ready, pending), 3),
        "state": svc.state.value,
        "queue": max(svc.inflight + svc.waiting, pending),
        "concurrency": svc.concurrency,
        "free_bytes": svc.free_bytes,
        "freeable_bytes": svc.freeable_bytes,
        "needs_bytes": 0 if ready <= Readiness.BUSY else svc.load_bytes,
        "service_s": svc.service_s,
        "note": WHY[ready],
    }


def _why(considered: list[dict[str, Any]], attempts: list[Attempt], chosen: str | None) -> str:
    if not considered:
        return "no live node hosts this model"
    parts = []
    for a in attempts:
        if a.outcome != "answered":
            parts.append(f"{a.node} {a.outcome} ({a.code or a.status}), tried the next node")
    best = next((c for c in considered if c["node"] == chosen), considered[0])
    free = best["free_bytes"] / GIB
    freeable = best["freeable_bytes"] / GIB
    parts.append(
        f"{best['node']}: {best['note']} (expected wait {best['expected_wait_s']:g} s; "
        f"{free:.2f} GiB free, {freeable:.2f} GiB it can free now)"
    )
    others = [c for c in considered if c["node"] != best["node"]]
    if others:
        parts.append(
            "ahead of "
            + "; ".join(
                f"{c['node']}: {c['note']} (expected wait {c['expected_wait_s']:g} s)"
                for c in others
            )
        )
    return "; ".join(parts)


class RouteLog:
    """The records of the last :data:`KEPT` routed requests, by request id."""

    def __init__(self, kept: int = KEPT) -> None:
        self.kept = kept
        self._records: OrderedDict[str, Record] = OrderedDict()
        self._ids = itertools.count(1)

    def own_id(self) -> str:
        """An id for an answer no node gave (the gateway's own refusal)."""
        return f"cluster-{next(self._ids)}"

    def start(
        self, model: str, index: RouteIndex, pending: Mapping[tuple[str, str], int]
    ) -> Record:
        hosts = {node for _, node, _ in index.candidates.get(model, ())}
        mine = {k: v for k, v in pending.items() if k[0] in hosts}
        return Record(model=model, index=index, pending=mine)

    def keep(self, request_id: str, record: Record) -> None:
        self._records[request_id] = record
        self._records.move_to_end(request_id)
        while len(self._records) > self.kept:
            self._records.popitem(last=False)

    def get(self, request_id: str) -> Record | None:
        return self._records.get(request_id)
