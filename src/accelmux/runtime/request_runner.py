"""The request runner: admit, wait, run and account one request through the Manager.

:meth:`RequestRunner.run` submits ``RequestArrived`` and waits on the request's
:class:`~accelmux.runtime.requests.Ticket`. A Dispatch runs the attempt (the backend
call, and for a stream the whole relay) in the caller's own task; a Reject or Fail ends
the request with :class:`~accelmux.runtime.requests.Refused`. A Preempt or Fail that
arrives while the attempt runs cancels that task: the ticket's ``interrupt`` tells the
two apart from a client that went away (a cancellation from outside), and a Preempt
sends the request back to wait for its next Dispatch. When the attempt ends the runner
submits ``RequestFinished`` (with the measured peak, or the error); when the client goes
away, ``RequestCancelled``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from accelmux.core.actions import Action, Dispatch, Enqueue, Fail, Preempt, Reject
from accelmux.core.events import (
    Demand,
    Event,
    RequestArrived,
    RequestCancelled,
    RequestFinished,
)
from accelmux.core.types import Reason
from accelmux.errors import BackendError
from accelmux.runtime.requests import Refused, Ticket

T = TypeVar("T")

#: An attempt returns its result and the measured peak bytes (None: unknown).
Attempt = Callable[[Dispatch], Awaitable[tuple[T, int | None]]]


class RequestRunner:
    """The tickets of the requests in progress, and the path each request takes."""

    def __init__(self, submit: Callable[[Event], None], closed: Callable[[], bool]) -> None:
        self._submit = submit
        self._closed = closed  # the Manager takes no more events
        self.tickets: dict[str, Ticket] = {}
        self.demands: dict[str, Demand] = {}
        #: Set by the runtime's shutdown: the last attempt to end sets ``idle``.
        self.stopping = False
        self.idle = asyncio.Event()
        self._ids = itertools.count(1)
        self._id_prefix = f"{os.getpid():x}{int(time.time()) & 0xFFFFF:x}"

    def new_request_id(self) -> str:
        return f"req-{self._id_prefix}-{next(self._ids)}"

    def running(self) -> bool:
        """Whether an attempt is running now."""
        return any(t.task is not None for t in self.tickets.values())

    def deliver(self, action: Dispatch | Enqueue | Reject | Fail | Preempt) -> None:
        """Hand a request action to its ticket (a request that ended already has none)."""
        ticket = self.tickets.get(action.request_id)
        if ticket is not None:
            ticket.deliver(action)

    def fail_all(self, detail: str) -> None:
        """End every open request (shutdown, after the drain)."""
        for ticket in list(self.tickets.values()):
            ticket.deliver(
                Fail(
                    request_id=ticket.request_id,
                    service=ticket.service,
                    reason=Reason.SHUTTING_DOWN,
                    detail=detail,
                )
            )

    async def run(
        self,
        service: str,
        demand: Demand,
        attempt: Attempt[T],
        *,
        request_id: str | None = None,
        on_dispatch: Callable[[Ticket], None] | None = None,
        keep_alive_s: float | None = None,
        pausable: bool = False,
    ) -> T:
        """Admit, wait, run and account one request; raises :class:`Refused` when the
        Manager rejected or failed it, BackendError when its backend failed.
        ``pausable``: its answer streams, so the Manager may pause it between tokens."""
        rid = request_id or self.new_request_id()
        if self._closed():
            raise Refused(
                Reject(
                    request_id=rid,
                    service=service,
                    reason=Reason.SHUTTING_DOWN,
                    retry_after_s=30.0,
                    detail="accelmux is shutting down",
                )
            )
        ticket = Ticket(rid, service, time.monotonic())
        self.tickets[rid] = ticket
        self.demands[rid] = demand
        try:
            self._submit(
                RequestArrived(
                    request_id=rid,
                    service=service,
                    demand=demand,
                    keep_alive_s=keep_alive_s,
                    pausable=pausable,
                )
            )
            while True:
                dispatch = await self._next_dispatch(ticket)
                if dispatch is None:
                    continue  # preempted before its attempt started: wait again
                if on_dispatch is not None:
                    on_dispatch(ticket)
                ran = await self._attempt(ticket, dispatch, attempt)
                if ran is not None:
                    return ran[0]
        except asyncio.CancelledError:
            self._submit(RequestCancelled(request_id=rid))
            raise
        finally:
            del self.tickets[rid]
            self.demands.pop(rid, None)
            if self.stopping and not self.running():
                self.idle.set()

    @staticmethod
    async def _next_dispatch(ticket: Ticket) -> Dispatch | None:
        """The next Dispatch to run; None: preempted before it started. Raises Refused on
        a Reject or Fail, including a Fail that came before the attempt started."""
        action: Action = await ticket.future
        if not isinstance(action, Dispatch):
            assert isinstance(action, (Reject, Fail))
            raise Refused(action)
        early = ticket.interrupt
        if early is not None:  # failed or preempted before the attempt started
            ticket.interrupt = None
            if isinstance(early, Preempt):
                return None
            raise Refused(early)
        ticket.dispatch = action
        return action

    async def _attempt(
        self, ticket: Ticket, dispatch: Dispatch, attempt: Attempt[T]
    ) -> tuple[T, int | None] | None:
        """Run one attempt in this task (no extra task per request) and account how it
        ended; None: it was preempted and the request waits again."""
        ticket.task = asyncio.current_task()
        try:
            result, peak = await attempt(dispatch)
        except asyncio.CancelledError:
            ticket.task = None
            interrupt = _take_interrupt(ticket)
            if interrupt is None:
                raise  # cancelled from outside: the client went away
            if isinstance(interrupt, Preempt):
                return None
            raise Refused(interrupt) from None
        except Exception as exc:
            ticket.task = None
            self._submit(_ended_by(ticket.request_id, dispatch, exc))
            raise
        ticket.task = None
        self._submit(
            RequestFinished(request_id=ticket.request_id, attempt=dispatch.attempt, peak_bytes=peak)
        )
        return result, peak


def _take_interrupt(ticket: Ticket) -> Fail | Preempt | None:
    """The Preempt or Fail that cancelled the running attempt, or None when the
    cancellation came (also) from outside: the client went away."""
    interrupt, ticket.interrupt = ticket.interrupt, None
    if interrupt is None:
        return None
    current = asyncio.current_task()
    if current is not None and current.uncancel() > 0:
        return None  # cancelled from outside as well
    return interrupt


def _ended_by(request_id: str, dispatch: Dispatch, exc: Exception) -> Event:
    """The event for an attempt that raised: its backend failed, the client went away
    mid-stream, or something else broke."""
    if isinstance(exc, BackendError):
        return RequestFinished(
            request_id=request_id, attempt=dispatch.attempt, ok=False, error=str(exc)
        )
    if isinstance(exc, ConnectionError):
        return RequestCancelled(request_id=request_id)
    return RequestFinished(
        request_id=request_id, attempt=dispatch.attempt, ok=False, error=repr(exc)
    )
