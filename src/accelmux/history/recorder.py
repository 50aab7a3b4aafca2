"""The recorder: turns each Manager round (the event in, the actions out) into history rows.

The runtime calls :meth:`HistoryRecorder.round` after every round of its Manager (see
:class:`accelmux.runtime.driver.RoundObserver`), so the recorder sees exactly what the
Manager saw and decided, on the Manager's own clock:

- ``RequestArrived`` opens a request row (service, class, sizes); its ``Dispatch``,
  first ``Enqueue`` (the reason it waited), ``Preempt``/``Pause``, and its end (``Reject``,
  ``Fail``, ``RequestFinished``, ``RequestCancelled``) fill it in; a streamed answer's
  first-chunk time and the tokens it produced come from the gateway's stream timer
  (``stream_figures``), a non-streamed one's produced tokens from its usage;
- ``Load`` then ``LoadFinished``/``LoadFailed`` make a load row (how long it took, the
  bytes the backend measured);
- every other decision (an unload with its reason, a resize, a pause) a decision row,
  and so do an unload's end (``unloaded``) and a crash (``crashed``);
- ``MemorySampled`` a sample row, with the compute the host's processes used since
  the sample before (``cpu_probe``).

Rows go to the :class:`~accelmux.history.store.HistoryWriter` in batches (at each
sample, at most every ``flush_s``); nothing here waits on the disk.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from accelmux.core.actions import (
    Action,
    Dispatch,
    Enqueue,
    Fail,
    Load,
    Pause,
    Preempt,
    Reject,
)
from accelmux.core.events import (
    BackendCrashed,
    Event,
    LoadFailed,
    LoadFinished,
    MemorySampled,
    RequestArrived,
    RequestCancelled,
    RequestFinished,
    Unloaded,
)
from accelmux.core.specs import ManagerSpec, ServiceSpec
from accelmux.history.cpu import CpuFigures
from accelmux.history.records import (
    DaemonRun,
    DecisionRecord,
    LoadRecord,
    RequestRecord,
    SampleRecord,
)

log = logging.getLogger("accelmux.history")

#: Requests left open at once before the oldest is written as ``open`` (a leak guard).
MAX_OPEN = 100_000


@dataclass(frozen=True, slots=True)
class StreamFigures:
    """What the gateway measured of one answer: when its first chunk went out (on the
    Manager's clock; None for an answer that did not stream) and how many tokens it
    produced (its usage, else its chunks; None when unknown)."""

    first_chunk_at: float | None
    output_tokens: int | None
    #: When its last chunk went out, and whether that was the stream's end.
    last_chunk_at: float | None = None
    completed: bool = False


class Sink(Protocol):
    def write(self, rows: Sequence[Any]) -> None: ...


def request_origin(request_id: str) -> str:
    """``job``, ``camera`` or ``http``, from the daemon's request id prefixes."""
    if request_id.startswith("job-"):
        return "job"
    if request_id.startswith("cam-"):
        return "camera"
    return "http"


class HistoryRecorder:
    def __init__(
        self,
        sink: Sink,
        spec: ManagerSpec,
        run: DaemonRun,
        *,
        stream_figures: Callable[[str], StreamFigures | None] = lambda _rid: None,
        cpu_probe: Callable[[str], CpuFigures] | None = None,
        flush_s: float = 2.0,
    ) -> None:
        self.sink = sink
        self.run = run.run
        self.stream_figures = stream_figures
        self.cpu_probe = cpu_probe
        self.flush_s = flush_s
        self._specs: dict[str, ServiceSpec] = {}
        for s in spec.services:
            self._specs[s.name] = s
            self._specs.setdefault(s.addressed_as, s)
        self.open: dict[str, RequestRecord] = {}
        self.loading: dict[str, LoadRecord] = {}
        self._rows: list[Any] = []
        self._last_flush = 0.0

    # ---- the observer ----------------------------------------------------------------------
    def round(self, now: float, event: Event | None, actions: Sequence[Action]) -> None:
        """One Manager round: ``event`` (None for the Manager's start) and its actions."""
        if event is not None:
            self._event(now, event)
        for action in actions:
            self._action(now, action)
        if isinstance(event, MemorySampled) or now - self._last_flush >= self.flush_s:
            self.flush(now)

    def flush(self, now: float | None = None) -> None:
        if now is not None:
            self._last_flush = now
        if self._rows:
            rows, self._rows = self._rows, []
            self.sink.write(rows)

    def close(self, now: float) -> None:
        """Write what is still open (requests as ``open``, loads unfinished) and flush."""
        self._rows.extend(self.open.values())
        self.open.clear()
        self._rows.extend(self.loading.values())
        self.loading.clear()
        self.flush(now)

    # ---- events ----------------------------------------------------------------------------
    def _event(self, now: float, event: Event) -> None:
        match event:
            case RequestArrived():
                self._arrived(now, event)
            case RequestFinished():
                req = self.open.get(event.request_id)
                if req is not None and event.attempt == req.attempts:
                    req.peak_bytes = event.peak_bytes
                    self._end(now, req, "ok" if event.ok else "error", None)
            case RequestCancelled():
                req = self.open.get(event.request_id)
                if req is not None:
                    self._end(now, req, "cancelled", None)
            case LoadFinished():
                self._loaded(now, event.service, True, event.weights_bytes, event.runtime_bytes)
            case LoadFailed():
                self._loaded(now, event.service, False, None, None, error=event.error)
            case MemorySampled():
                self._sample(now, event)
            case Unloaded() | BackendCrashed():
                # when memory came back: an unload's end, a crash
                kind = "unloaded" if isinstance(event, Unloaded) else "crashed"
                self._rows.append(DecisionRecord(self.run, now, kind, event.service, kind))
            case _:
                pass

    def _arrived(self, now: float, ev: RequestArrived) -> None:
        spec = self._specs.get(ev.service)
        d = ev.demand
        self.open[ev.request_id] = RequestRecord(
            run=self.run,
            request_id=ev.request_id,
            service=ev.service,
            replica="",
            cls=spec.cls.label if spec is not None else "",
            kind=spec.kind.value if spec is not None else "",
            origin=request_origin(ev.request_id),
            t_arrived=now,
            prompt_tokens=d.prompt_tokens,
            max_output_tokens=d.output_tokens,
            kv_tokens=d.kv_tokens,
            units=d.units,
            pausable=int(ev.pausable),
        )
        if len(self.open) > MAX_OPEN:
            oldest = next(iter(self.open))
            self._rows.append(self.open.pop(oldest))

    def _end(self, now: float, req: RequestRecord, outcome: str, reason: str | None) -> None:
        req.outcome = outcome
        req.reason = reason
        req.t_finished = now
        figures = self.stream_figures(req.request_id)
        if figures is not None:
            req.stream = int(figures.first_chunk_at is not None)
            req.t_first_token = figures.first_chunk_at
            req.output_tokens = figures.output_tokens
            if outcome == "cancelled" and figures.completed and figures.last_chunk_at:
                # the client hung up once the stream's end reached it, before the daemon
                # saw the stream close: it was served, when its last chunk went out
                req.outcome, req.t_finished = "ok", figures.last_chunk_at
        self.open.pop(req.request_id, None)
        self._rows.append(req)

    def _loaded(
        self,
        now: float,
        service: str,
        ok: bool,
        weights: int | None,
        runtime: int | None,
        *,
        error: str | None = None,
    ) -> None:
        row = self.loading.pop(service, None)
        if row is None:
            return
        row.t_end = now
        row.ok = int(ok)
        row.weights = weights
        row.runtime = runtime
        # the backend's own words can name a file; keep only the first line's start
        row.error = None if error is None else error.splitlines()[0][:120]
        self._rows.append(row)

    def _sample(self, now: float, ev: MemorySampled) -> None:
        cpu = self.cpu_probe(ev.device) if self.cpu_probe else CpuFigures()
        self._rows.append(
            SampleRecord(
                run=self.run,
                t=now,
                device=ev.device,
                used=ev.used_bytes,
                managed=sum(ev.per_service.values()),
                baseline=ev.baseline_bytes,
                overhead=ev.overhead_bytes,
                per_service=json.dumps(ev.per_service, sort_keys=True),
                cpu_managed=cpu.cpu_managed,
                cpu_total=cpu.cpu_total,
                run_managed=cpu.run_managed,
                run_total=cpu.run_total,
                ticks=cpu.ticks,
            )
        )

    # ---- actions ---------------------------------------------------------------------------
    def _action(self, now: float, action: Action) -> None:
        match action:
            case Dispatch():
                req = self.open.get(action.request_id)
                if req is not None:
                    req.attempts = action.attempt
                    req.replica = action.service
                    if req.t_dispatched is None:
                        req.t_dispatched = now
                return
            case Enqueue():
                req = self.open.get(action.request_id)
                if req is not None and req.first_wait is None and req.t_dispatched is None:
                    req.first_wait = action.reason.value
                return
            case Load():
                self.loading[action.service] = LoadRecord(
                    run=self.run,
                    service=action.service,
                    t_start=now,
                    from_tier=action.from_tier.value,
                    kv_pool=action.kv_pool_bytes,
                    reason=action.reason.value,
                )
            case Reject() | Fail():
                req = self.open.get(action.request_id)
                if req is not None:
                    outcome = "rejected" if isinstance(action, Reject) else "failed"
                    self._end(now, req, outcome, action.reason.value)
            case Preempt():
                req = self.open.get(action.request_id)
                if req is not None:
                    req.preemptions += 1
            case Pause():
                req = self.open.get(action.request_id)
                if req is not None:
                    req.pauses += 1
            case _:
                pass
        self._rows.append(
            DecisionRecord(
                run=self.run,
                t=now,
                action=type(action).__name__.lower(),
                service=action.service,
                reason=action.reason.value,
                request_id=getattr(action, "request_id", None),
            )
        )
