"""Waiting on a condition with a deadline: what a test does instead of a fixed sleep.

A fixed ``sleep`` before an assertion guesses how long the system under test needs; on a
loaded machine the guess is wrong and the test fails for nothing (or a slow machine makes
every run slow). These helpers poll the condition until it holds and fail with a message
naming it when the deadline passes. ``tests/docs/test_no_fixed_sleeps.py`` keeps new fixed
sleeps out.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

#: Seconds between two looks at the condition.
INTERVAL_S = 0.02


def wait_until(
    predicate: Callable[[], T], *, timeout: float = 10.0, message: str = "the condition"
) -> T:
    """Return the predicate's first truthy value; fail once ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {message}")
        time.sleep(INTERVAL_S)


async def async_wait_until(
    predicate: Callable[[], T | Awaitable[T]],
    *,
    timeout: float = 10.0,
    message: str = "the condition",
) -> T:
    """``wait_until`` inside an event loop; the predicate may be a coroutine function."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {message}")
        await asyncio.sleep(INTERVAL_S)
