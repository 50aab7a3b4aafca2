"""A small fan-out of decision records to live subscribers (``GET /admin/events``)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

#: Records a slow subscriber may lag behind before newer ones are dropped for it.
SUBSCRIBER_BUFFER = 1000


class DecisionBus:
    def __init__(self) -> None:
        self._subscribers: set[asyncio.Queue[dict[str, Any] | None]] = set()
        self.dropped = 0

    @property
    def active(self) -> bool:
        return bool(self._subscribers)

    def subscribe(self) -> asyncio.Queue[dict[str, Any] | None]:
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(SUBSCRIBER_BUFFER)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[dict[str, Any] | None]) -> None:
        self._subscribers.discard(queue)

    def publish(self, record: dict[str, Any]) -> None:
        for queue in self._subscribers:
            try:
                queue.put_nowait(record)
            except asyncio.QueueFull:
                self.dropped += 1

    def close(self) -> None:
        """Tell every subscriber the stream ends (``None``)."""
        for queue in self._subscribers:
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)
