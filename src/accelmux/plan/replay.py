"""A scenario run through the simulator, recorded as the daemon records itself.

The run's Manager rounds go to the same :class:`~accelmux.history.recorder.HistoryRecorder`
the daemon uses (into memory), so a replay leaves the same rows as the real daemon:
requests, loads, decisions and memory samples, which :mod:`accelmux.plan.outcomes`
reads the same way for both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from accelmux import __version__
from accelmux.history.recorder import HistoryRecorder, StreamFigures
from accelmux.history.records import (
    DaemonRun,
    DecisionRecord,
    LoadRecord,
    RequestRecord,
    SampleRecord,
)
from accelmux.plan.outcomes import Outcome, from_record, from_trace
from accelmux.sim.executor import Simulation
from accelmux.sim.recorded import TraceRow, read_trace
from accelmux.sim.scenario import RecordedWorkload, Scenario


class _Rows:
    """A sink that keeps the rows in memory, by kind."""

    def __init__(self) -> None:
        self.requests: list[RequestRecord] = []
        self.loads: list[LoadRecord] = []
        self.decisions: list[DecisionRecord] = []
        self.samples: list[SampleRecord] = []

    def write(self, rows: Sequence[Any]) -> None:
        for row in rows:
            if isinstance(row, RequestRecord):
                self.requests.append(row)
            elif isinstance(row, LoadRecord):
                self.loads.append(row)
            elif isinstance(row, DecisionRecord):
                self.decisions.append(row)
            elif isinstance(row, SampleRecord):
                self.samples.append(row)


@dataclass
class Replay:
    policy: str
    requests: list[RequestRecord]
    loads: list[LoadRecord]
    decisions: list[DecisionRecord]
    samples: list[SampleRecord]
    #: The trace row each replayed request came from (requests of other workloads: none).
    index_of: dict[str, int] = field(default_factory=dict)
    llm: frozenset[str] = frozenset()
    duration_s: float = 0.0
    warmup_s: float = 0.0
    #: Allocations that did not fit the device (the physical model's OOMs).
    ooms: int = 0
    #: Trace rows never sent: a client would send them once the earlier request they
    #: follow ended, which it had not when the replay ended.
    unsent: list[TraceRow] = field(default_factory=list)
    classes: dict[str, str] = field(default_factory=dict)

    def outcomes(self) -> list[Outcome]:
        """Every request's outcome: a trace row's under its index, any other under a
        negative index of its own; a row never sent is still waiting (``open``)."""
        out = []
        for n, r in enumerate(self.requests, start=1):
            index = self.index_of.get(r.request_id, -n)
            out.append(from_record(r, index, r.service in self.llm))
        for row in self.unsent:
            o = from_trace(row, self.classes.get(row.service, ""), row.service in self.llm)
            out.append(
                dataclasses.replace(
                    o,
                    queue_s=None,
                    response_s=None,
                    total_s=None,
                    outcome="open",
                    reason="",
                    first_decision="dispatch",
                )
            )
        return out


def replay(scn: Scenario, policy: str, *, seed: int = 0) -> Replay:
    """Run ``scn`` once with ``policy``, recorded."""
    sim = Simulation(scn, policy, seed)
    rows = _Rows()

    def figures(rid: str) -> StreamFigures | None:
        req = sim.requests.get(rid)
        if req is None:
            return None
        streamed = isinstance(req.tag, TraceRow) and req.tag.stream
        if not isinstance(req.tag, TraceRow):
            streamed = sim.is_llm(req.service)  # a generated LLM request streams
        tokens = req.demand.output_tokens if sim.is_llm(req.service) else None
        first = req.first_token_at if streamed else None
        return StreamFigures(first_chunk_at=first, output_tokens=tokens)

    run = DaemonRun("replay", 0.0, __version__, "{}", "{}")
    recorder = HistoryRecorder(rows, sim.spec, run, stream_figures=figures, flush_s=1e9)
    sim.observers.append(recorder)
    out = sim.run()
    recorder.close(sim.clock.now())
    index_of = {
        rid: req.tag.index for rid, req in sim.requests.items() if isinstance(req.tag, TraceRow)
    }
    llm = frozenset(s.addressed_as for s in sim.spec.services if s.kind.is_llm)
    rows.requests.sort(key=lambda r: (r.t_arrived, r.request_id))
    sent = set(index_of.values())
    unsent = [
        row
        for w in scn.config.workloads
        if isinstance(w, RecordedWorkload)
        for row in read_trace(scn.resolve(w.path))
        if row.index not in sent
        and row.service not in w.drop_services
        and row.service in scn.config.services
        and row.arrival_s + w.from_s < sim.duration
    ]
    return Replay(
        policy=policy,
        requests=rows.requests,
        loads=rows.loads,
        decisions=rows.decisions,
        samples=rows.samples,
        index_of=index_of,
        llm=llm,
        duration_s=sim.duration,
        warmup_s=min(scn.config.simulation.warmup_s, sim.duration),
        ooms=len(out.ooms),
        unsent=unsent,
        classes={n: svc.cls.label for n, svc in scn.config.services.items()},
    )
