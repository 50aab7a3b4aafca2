"""The streamed requests of a worker: pulling their chunks, pausing and resuming them.

A streamed infer is a :class:`StreamRun`: its chunks are pulled one at a time on its
component's thread (:meth:`Streams.drive`), and between two chunks it can stop (a
pause: the thread is free for the next task, the generator stays suspended, the
daemon's stream stays open and receives nothing) and continue later (a resume queues it
on that thread again). Its states::

    queued -> running -> ended
      ^          | pause (at the next chunk boundary)
      | resume   v
      +------ paused

A pause of a queued run takes at once (nothing of it runs); a pause of a running one
takes at the next chunk boundary and is answered then; ``park`` also saves its llama.cpp
sequence off the context (:class:`~accelmux.worker.component_base.StreamControl`). A
resume is answered when the run is queued again: it continues when its component's
thread is free (after the task running there now: another stream runs on until it ends
or pauses). Requests are named by the daemon's request id, per service; the ones that
ended lately are remembered, so a late pause or resume of a finished request is told
"ended" rather than "unknown". A paused run outlives an unload of its service: its
component keeps what it parked in host memory (a llama.cpp sequence:
:meth:`~accelmux.models.chat.LlamaTextModel.unload`) and it continues after the next
load of the same model; a resume before that load is answered with an error and leaves
it paused. It ends when its client goes away (a cancel), when its component cannot keep
it over an unload, when its service loads another model, or when the service stops
(``unload`` with ``end_paused``).
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import Executor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from accelmux.errors import BackendError, RequestError
from accelmux.models.llama_sequences import SequenceReport
from accelmux.worker.component_base import Component, Slot, StreamControl

#: Ended requests remembered per worker (a pause or resume may arrive after the end).
ENDED_KEPT = 1024

RequestKey = tuple[str, str]  # (service, the daemon's request id)


class RunState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    PAUSED = "paused"
    ENDED = "ended"


@dataclass(eq=False)
class StreamRun:
    """One streamed infer; its fields change under ``lock`` (a pause or resume arrives
    on the worker's main thread while the run's chunks are pulled on its component's)."""

    rid: int  # the frame id of the infer
    service: str
    request_id: str
    endpoint: str
    body: dict[str, Any]
    #: the key of the component it runs on
    component: str = ""
    control: StreamControl = field(default_factory=StreamControl)
    chunks: Iterator[bytes] | None = None
    state: RunState = RunState.QUEUED
    pause_wanted: bool = False
    park: bool = False
    #: frame ids of pause ops to answer when the pause takes
    waiters: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def key(self) -> RequestKey:
        return (self.service, self.request_id)


class Runs:
    """The worker's streamed runs by frame id and by request, its non-streamed calls,
    and the requests that ended lately."""

    def __init__(self) -> None:
        self.by_rid: dict[int, StreamRun] = {}
        self.by_request: dict[RequestKey, StreamRun] = {}
        self.calls: dict[RequestKey, int] = {}  # non-streamed requests now running
        self._ended: OrderedDict[RequestKey, None] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, run: StreamRun) -> None:
        with self._lock:
            self.by_rid[run.rid] = run
            if run.request_id:
                self.by_request[run.key] = run

    def add_call(self, key: RequestKey, rid: int) -> None:
        if key[1]:
            with self._lock:
                self.calls[key] = rid

    def end(self, rid: int, key: RequestKey) -> None:
        with self._lock:
            run = self.by_rid.pop(rid, None)
            if run is not None and self.by_request.get(key) is run:
                del self.by_request[key]
            if self.calls.get(key) == rid:
                del self.calls[key]
            if key[1]:
                self._ended[key] = None
                self._ended.move_to_end(key)
                while len(self._ended) > ENDED_KEPT:
                    self._ended.popitem(last=False)

    def ended(self, key: RequestKey) -> bool:
        with self._lock:
            return key in self._ended

    def of_service(self, service: str) -> list[StreamRun]:
        with self._lock:
            return [r for r in self.by_rid.values() if r.service == service]

    def of_all(self) -> list[StreamRun]:
        with self._lock:
            return list(self.by_rid.values())


class Host(Protocol):
    """What :class:`Streams` needs of the worker."""

    def send(self, header: dict[str, Any], blob: bytes = b"") -> None: ...

    def reply_error(self, rid: int, exc: BaseException) -> None: ...

    def begin_request(self, rid: int, service: str) -> None:
        """A request starts running (its memory peak is measured from now)."""
        ...

    def end_request(self, rid: int) -> int:
        """A request ended: its measured peak (bytes above its start)."""
        ...

    def suspend_request(self, rid: int) -> None:
        """A request paused: what the process allocates meanwhile is not its memory."""
        ...

    def resume_request(self, rid: int) -> None:
        """A paused request runs again: its peak is measured again from now."""
        ...

    def component_of(self, service: str) -> tuple[Slot, Component, Executor] | None:
        """The service's slot, its component and that component's thread."""
        ...


class Streams:
    """Every streamed run of one worker; the pause, resume and cancel ops on them."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.runs = Runs()

    # -- running ----------------------------------------------------------------------
    def start(self, run: StreamRun, *, paused: bool) -> None:
        """Queue a new run on its component's thread (or keep it paused until resumed)."""
        self.runs.add(run)
        if paused:
            run.state = RunState.PAUSED
        else:
            self._queue(run)

    def _queue(self, run: StreamRun) -> None:
        if not self._submit(run):
            self.finish(run, BackendError(f"{run.service} is not loaded here"))

    def _submit(self, run: StreamRun) -> bool:
        """Queue ``run`` on its component's thread; False when its service is not loaded."""
        where = self.host.component_of(run.service)
        if where is None:
            return False
        try:
            where[2].submit(self.drive, run)
        except RuntimeError:  # its thread stopped: the service is unloading
            return False
        return True

    def drive(self, run: StreamRun) -> None:
        """Pull ``run``'s chunks (on its component's thread) until it ends or pauses."""
        with run.lock:
            if run.state is not RunState.QUEUED:
                return  # paused again, or ended, before this task started
            run.state = RunState.RUNNING
        ended = False
        try:
            if run.chunks is None:
                where = self.host.component_of(run.service)
                if where is None:
                    raise BackendError(f"{run.service} is not loaded here")
                slot, component, _ = where
                self.host.begin_request(run.rid, run.service)
                run.chunks = component.stream(slot, run.endpoint, run.body, run.control)
            else:
                self.host.resume_request(run.rid)
                run.control.resume()  # puts a parked sequence back
            while True:
                with run.lock:
                    if run.pause_wanted:
                        run.state, run.pause_wanted = RunState.PAUSED, False
                        park, waiters, run.waiters = run.park, run.waiters, []
                        break
                chunk = next(run.chunks, None)
                if chunk is None:
                    ended = True
                    break
                self.host.send({"id": run.rid, "type": "chunk"}, chunk)
            if not ended:
                # a resume arriving now queues behind this task: the pause completes first
                self.host.suspend_request(run.rid)
                report = run.control.pause(park=park)
        except BaseException as exc:
            self.finish(run, exc)
            return
        if ended:
            self.finish(run)
            return
        # "paused" even when the generation itself is done and only its last chunks wait
        reply = {**report.as_dict(), "state": RunState.PAUSED.value}
        for waiter in waiters:
            self.host.send({"id": waiter, "type": "ok", **reply})

    def finish(self, run: StreamRun, error: BaseException | None = None) -> None:
        """End ``run``: its final frame (ok with its peak, or the error) goes out."""
        with run.lock:
            run.state = RunState.ENDED
            waiters, run.waiters = run.waiters, []
        self.runs.end(run.rid, run.key)
        peak = self.host.end_request(run.rid) + run.control.kv
        if error is None:
            self.host.send(
                {
                    "id": run.rid,
                    "type": "ok",
                    "status": 200,
                    "content_type": "text/event-stream",
                    "peak_bytes": peak,
                }
            )
        else:
            if not isinstance(error, (BackendError, RequestError)):
                traceback.print_exception(error, file=sys.stderr)
            self.host.reply_error(run.rid, error)
        for waiter in waiters:
            self.host.send({"id": waiter, "type": "ok", "state": RunState.ENDED.value})

    def drop(self, run: StreamRun, error: BaseException | None) -> None:
        """End a paused run (on its component's thread): its generator is closed, which
        ends its llama.cpp sequence and frees what it parked."""
        with run.lock:
            if run.state is not RunState.PAUSED:
                return  # resumed or ended meanwhile
        chunks, run.chunks = run.chunks, None
        close = getattr(chunks, "close", None)
        try:
            if close is not None:
                close()
        finally:
            self.finish(run, error)

    # -- ops (on the worker's main thread) ---------------------------------------------
    def _lookup(self, rid: int, h: dict[str, Any], op: str) -> StreamRun | None:
        """The run ``h`` names; None after answering for a request that has none."""
        key = (str(h.get("service", "")), str(h.get("request_id", "")))
        run = self.runs.by_request.get(key)
        if run is not None:
            return run
        if self.runs.ended(key):
            self.host.send({"id": rid, "type": "ok", "state": RunState.ENDED.value})
        elif key in self.runs.calls and op == "resume":
            self.host.send({"id": rid, "type": "ok", "state": RunState.RUNNING.value})
        elif key in self.runs.calls:
            self.host.reply_error(
                rid,
                BackendError(
                    f"request {key[1]} of {key[0]} is not streamed: only a streamed "
                    "generation can pause here"
                ),
            )
        else:
            self.host.reply_error(
                rid, BackendError(f"no request {key[1]!r} of {key[0]!r} in this worker")
            )
        return None

    def op_pause(self, rid: int, h: dict[str, Any]) -> None:
        run = self._lookup(rid, h, "pause")
        if run is None:
            return
        park = bool(h.get("park"))
        with run.lock:
            if run.state is RunState.RUNNING:
                run.pause_wanted = True
                run.park = run.park or park
                run.waiters.append(rid)
                return  # answered at the next chunk boundary
            if run.state is RunState.QUEUED:
                run.state = RunState.PAUSED  # its queued task will find it paused
            state = run.state
        if state is RunState.PAUSED and park and run.control.sequence is not None:
            where = self.host.component_of(run.service)
            if run.control.parked_bytes == 0 and where is not None:
                where[2].submit(self._park, rid, run)
                return
        report = SequenceReport(state.value, run.control.parked_bytes)
        self.host.send({"id": rid, "type": "ok", **report.as_dict()})

    def _park(self, rid: int, run: StreamRun) -> None:
        """Park a run that paused without parking (on its component's thread)."""
        with run.lock:
            state = run.state
        try:
            if state is RunState.PAUSED:
                report = run.control.pause(park=True)
            else:
                report = SequenceReport(state.value)
        except BaseException as exc:
            self.host.reply_error(rid, exc)
            return
        self.host.send({"id": rid, "type": "ok", **report.as_dict()})

    def op_resume(self, rid: int, h: dict[str, Any]) -> None:
        run = self._lookup(rid, h, "resume")
        if run is None:
            return
        waiters: list[int] = []
        queue = False
        with run.lock:
            state = run.state
            if state is RunState.RUNNING and run.pause_wanted:
                run.pause_wanted = False  # resumed before the pause took
                waiters, run.waiters = run.waiters, []
            elif state is RunState.PAUSED:
                run.state = RunState.QUEUED
                queue = True
        if queue and not self._submit(run):
            with run.lock:
                if run.state is RunState.QUEUED:
                    run.state = RunState.PAUSED
            self.host.reply_error(
                rid,
                BackendError(
                    f"{run.service} is not loaded: request {run.request_id} stays paused "
                    "until it loads again"
                ),
            )
            return
        for waiter in waiters:
            self.host.send({"id": waiter, "type": "ok", "state": RunState.RUNNING.value})
        reply = "resuming" if queue else state.value
        self.host.send({"id": rid, "type": "ok", "state": reply})

    def cancel(self, rid: int) -> None:
        """The daemon gave up on frame ``rid``: a paused run ends now (a running one sees
        its cancel flag after its next chunk)."""
        run = self.runs.by_rid.get(rid)
        if run is None:
            return
        run.control.cancelled.set()
        with run.lock:
            paused = run.state is RunState.PAUSED
        where = self.host.component_of(run.service)
        if paused and where is not None:
            where[2].submit(self.drop, run, None)
        elif paused:
            self.drop(run, None)

    def paused_of(self, service: str) -> list[StreamRun]:
        """The paused runs of ``service``."""
        return [r for r in self.runs.of_service(service) if r.state is RunState.PAUSED]

    # -- facts --------------------------------------------------------------------------
    def report(self, service: str) -> dict[str, int]:
        runs = self.runs.of_service(service)
        paused = [r for r in runs if r.state is RunState.PAUSED]
        return {
            "paused": len(paused),
            "parked_kv": sum(r.control.parked_bytes for r in runs),
        }
