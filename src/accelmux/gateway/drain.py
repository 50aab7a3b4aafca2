"""The unread rest of a refused body, read slowly and then dropped.

A request refused before its body is read (a 413 by its ``Content-Length``, a 401, a 404)
still has the body coming. Closing at once makes the client's kernel answer its next
packets with a reset, and most clients (``openai``, ``requests``) then report a broken
connection instead of the answer. So the body is read and dropped first, as aiohttp and
nginx do ("lingering close"), but not at any speed: aiohttp reads it as fast as the client
sends, and a client on loopback sending 25 MiB bodies in a loop keeps one core busy in
the event loop, which every other request then waits for. Here every refused body shares
one budget of :data:`DRAIN_RATE` bytes a second (a token bucket); while a reader waits
for its turn, aiohttp's flow control stops reading its socket, so the bytes wait in the
kernel and cost nothing. A body not read within :data:`DRAIN_TIME_S` is abandoned and its
connection closed once the answer is out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import StreamReader, web
from aiohttp.typedefs import Middleware

from accelmux.gateway.connections import MAX_LINGERING_REFUSALS, REFUSAL_LINGER_S, guarded

#: Bytes a second all refused bodies together are read at.
DRAIN_RATE = 32 * 1024**2
#: Longest time one refused body is read before its connection is closed.
DRAIN_TIME_S = 10.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ReadPace:
    """A token bucket: bytes a second shared by the bodies read through it."""

    __slots__ = ("_next_free", "rate")

    def __init__(self, rate: float = DRAIN_RATE) -> None:
        self.rate = rate
        self._next_free = 0.0

    def delay_for(self, nbytes: int, now: float) -> float:
        """Reserve ``nbytes`` of the budget: the seconds to wait before reading more."""
        start = max(now, self._next_free)
        self._next_free = start + nbytes / self.rate
        return start - now


async def drain(content: StreamReader, budget: ReadPace, limit_s: float) -> bool:
    """Read and drop what is left of ``content`` within ``limit_s``, at the budget's pace.

    True when the body was read to its end."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not content.is_eof():
        left = deadline - loop.time()
        if left <= 0:
            return False
        try:
            chunk = await asyncio.wait_for(content.readany(), timeout=left)
        except (TimeoutError, ConnectionError, RuntimeError):  # RuntimeError: aiohttp's
            # "Connection closed." when the client went away
            return False
        if not chunk:
            break
        wait = budget.delay_for(len(chunk), loop.time())
        if wait > 0:
            if loop.time() + wait > deadline:
                return False
            await asyncio.sleep(wait)
    return True


async def answer_first(request: web.Request, response: web.StreamResponse) -> None:
    """Send ``response`` now, before the rest of the body is read (aiohttp then finds it
    sent): a refusal reaches the client when it is decided, not after the drain."""
    if not response.prepared:
        await response.prepare(request)
        await response.write_eof()


def drain_middleware(budget: ReadPace | None = None, limit_s: float = DRAIN_TIME_S) -> Middleware:
    """After the handler, answer, then read what it left of the body (see the module's
    docstring); the runner's own lingering is off (``lingering_time=0``), so this is the
    only reader. A refusal at the door (an answer that closes the connection: a missing
    key, a share or the reserve exceeded) no longer counts against any share while the
    client reads it, and is read for at most ``REFUSAL_LINGER_S`` (at most
    ``MAX_LINGERING_REFUSALS`` at once; beyond, it closes at once)."""
    shared = budget or ReadPace()

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        content = request.content
        if not request.body_exists or content.is_eof():
            return response
        if response.keep_alive is False:
            found = guarded(request)
            if found is None:
                return response
            guard, conn = found
            guard.release(conn)
            if guard.lingering >= MAX_LINGERING_REFUSALS:
                return response
            guard.lingering += 1
            try:
                await answer_first(request, response)
                await drain(content, shared, REFUSAL_LINGER_S)
            finally:
                guard.lingered()
            return response
        await answer_first(request, response)
        if not await drain(content, shared, limit_s):
            response.force_close()
        return response

    return middleware
