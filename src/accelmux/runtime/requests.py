"""Tickets: how one HTTP request waits for, runs under and ends with the Manager's decisions.

``Runtime.run_request`` submits ``RequestArrived`` and waits on the ticket for a
Dispatch, Reject or Fail. On Dispatch it runs the attempt (the backend call, and for a
stream the whole relay) as a task; a Preempt or Fail cancels that task. A Preempt re-arms
the ticket and the request waits again for its next Dispatch; a Fail ends it. When the
attempt ends the runtime submits ``RequestFinished`` with the measured peak; when the
client goes away it submits ``RequestCancelled``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from accelmux.core.actions import Action, Dispatch, Enqueue, Fail, Preempt, Reject
from accelmux.core.types import Reason
from accelmux.errors import AccelmuxError


class Refused(AccelmuxError):
    """The Manager ended the request unserved (Reject) or cut it off (Fail)."""

    def __init__(self, action: Reject | Fail) -> None:
        self.action = action
        super().__init__(f"{action.reason.value}: {action.detail}".rstrip(": "))

    @property
    def reason(self) -> Reason:
        return self.action.reason

    @property
    def retry_after_s(self) -> float | None:
        return self.action.retry_after_s if isinstance(self.action, Reject) else None


class Ticket:
    __slots__ = (
        "arrived",
        "dispatch",
        "future",
        "interrupt",
        "request_id",
        "service",
        "task",
        "wait_reason",
    )

    def __init__(self, request_id: str, service: str, arrived: float) -> None:
        self.request_id = request_id
        self.service = service
        self.arrived = arrived
        self.future: asyncio.Future[Action] = asyncio.get_running_loop().create_future()
        #: The task running the current attempt (None between attempts).
        self.task: asyncio.Task[Any] | None = None
        self.interrupt: Fail | Preempt | None = None
        self.dispatch: Dispatch | None = None
        self.wait_reason: Reason | None = None

    def deliver(self, action: Action) -> None:
        """Called by the executor with every action about this request."""
        if isinstance(action, Enqueue):
            self.wait_reason = action.reason
        elif isinstance(action, (Dispatch, Reject)):
            if not self.future.done():
                self.future.set_result(action)
        elif isinstance(action, (Preempt, Fail)):
            task = self.task  # set only while an attempt runs
            if task is not None and not task.done() and self.interrupt is None:
                self.interrupt = action
                task.cancel()
                if isinstance(action, Preempt):
                    self.future = asyncio.get_running_loop().create_future()
            elif isinstance(action, Fail) and not self.future.done():
                self.future.set_result(action)
            elif task is None and self.future.done() and self.interrupt is None:
                # Dispatched, but the attempt has not started yet: it must not start.
                self.interrupt = action
                if isinstance(action, Preempt):
                    self.future = asyncio.get_running_loop().create_future()
