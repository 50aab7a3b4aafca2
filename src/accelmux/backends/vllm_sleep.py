"""vLLM's sleep mode over HTTP: the cheap eviction of a vLLM server (tier ``sleeping``).

vLLM's OpenAI-compatible server started with ``--enable-sleep-mode`` and
``VLLM_SERVER_DEV_MODE=1`` in its environment answers ``POST /sleep?level=1`` (the
weights are offloaded to CPU RAM and the KV cache is discarded; the process stays),
``POST /wake_up`` and ``GET /is_sleeping`` (``{"is_sleeping": true|false}``). See vLLM's
documentation: https://docs.vllm.ai/en/latest/features/sleep_mode/ (the sleep levels and
the server endpoints, which exist only in development mode) and the server's router,
https://docs.vllm.ai/en/v0.14.0/api/vllm/entrypoints/serve/sleep/api_router/ . A sleep
request may answer before the engine is asleep, so both calls here wait until
``/is_sleeping`` says so.

Each call returns None when the server did what was asked, else why not (a refusal, a
broken connection, no answer within the timeout); it never raises.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

#: The environment variable that makes vLLM's server expose the sleep endpoints.
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"


async def _post(session: aiohttp.ClientSession, url: str, timeout_s: float) -> str | None:
    try:
        async with session.post(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status == 200:
                return None
            text = (await resp.read())[:200].decode("utf-8", "replace")
            return f"HTTP {resp.status}: {text}" if text else f"HTTP {resp.status}"
    except TimeoutError:  # before ClientError: aiohttp's timeouts are both
        return f"no answer in {timeout_s:g}s"
    except (aiohttp.ClientError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"


async def is_sleeping(session: aiohttp.ClientSession, base: str, timeout_s: float) -> bool | None:
    """The server's own answer, or None when it gave none."""
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with session.get(base + "/is_sleeping", timeout=timeout) as resp:
            if resp.status != 200:
                return None
            answer = await resp.json(content_type=None)
    except (aiohttp.ClientError, OSError, ValueError, TimeoutError):
        return None
    value = answer.get("is_sleeping") if isinstance(answer, dict) else None
    return value if isinstance(value, bool) else None


async def _until(
    session: aiohttp.ClientSession, base: str, asleep: bool, deadline: float
) -> str | None:
    delay = 0.02
    while True:
        left = deadline - time.monotonic()
        state = await is_sleeping(session, base, max(0.1, min(5.0, left)))
        if state is asleep:
            return None
        if time.monotonic() > deadline:
            said = "no answer" if state is None else f"is_sleeping: {str(state).lower()}"
            return f"still {'awake' if asleep else 'asleep'} at the timeout ({said})"
        await asyncio.sleep(delay)
        delay = min(0.5, delay * 1.5)


async def sleep(session: aiohttp.ClientSession, base: str, timeout_s: float) -> str | None:
    """Put the server to sleep, level 1 (weights to CPU RAM)."""
    deadline = time.monotonic() + timeout_s
    why = await _post(session, base + "/sleep?level=1", timeout_s)
    if why is not None:
        return f"POST /sleep?level=1: {why}"
    return await _until(session, base, True, deadline)


async def wake_up(session: aiohttp.ClientSession, base: str, timeout_s: float) -> str | None:
    """Wake the server (its weights back on the device, its KV cache allocated again)."""
    deadline = time.monotonic() + timeout_s
    why = await _post(session, base + "/wake_up", timeout_s)
    if why is not None:
        return f"POST /wake_up: {why}"
    return await _until(session, base, False, deadline)
