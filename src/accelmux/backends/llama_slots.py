"""llama-server's own endpoints that pausing a sequence needs (besides ``/completion``).

``POST /slots/{id}?action=save`` with ``{"filename": NAME}`` writes the slot's KV cache
(and its cached tokens) to ``NAME`` in the directory the server was started with
(``--slot-save-path``); ``?action=restore`` reads it back into a slot, and
``?action=erase`` empties a slot. ``GET /slots`` lists the slots and whether each is
processing; ``POST /detokenize`` turns token ids into text; ``POST /apply-template``
renders chat messages with the model's template into the prompt the chat endpoint would
use. Every call answers a :class:`~accelmux.errors.BackendError` when the server refuses,
breaks off or does not answer in time, never an aiohttp exception.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from accelmux.errors import BackendError


class LlamaServerClient:
    """The calls, against the server's current address (it changes at each start)."""

    def __init__(
        self,
        base_url: Callable[[], str],
        session: Callable[[], aiohttp.ClientSession],
        *,
        timeout_s: float = 30.0,
    ) -> None:
        self._base_url = base_url
        self._session = session
        self.timeout_s = timeout_s

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
        url = self._base_url() + path
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        try:
            async with self._session().request(method, url, json=body, timeout=timeout) as resp:
                answer = await resp.json(content_type=None)
                if resp.status != 200:
                    message = answer.get("error", answer) if isinstance(answer, dict) else answer
                    raise BackendError(f"{method} {path}: HTTP {resp.status}: {message}")
                return answer
        except TimeoutError:  # before ClientError: aiohttp's timeouts are both
            raise BackendError(f"{method} {path}: no answer in {self.timeout_s:g}s") from None
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise BackendError(f"{method} {path}: {type(exc).__name__}: {exc}") from None

    async def slots(self) -> list[dict[str, Any]]:
        answer = await self._call("GET", "/slots")
        if not isinstance(answer, list):
            raise BackendError(f"GET /slots: not a list (got {type(answer).__name__})")
        return [slot for slot in answer if isinstance(slot, dict)]

    async def wait_idle(self, slot: int) -> None:
        """Until ``slot`` is processing nothing (the server cancels a request whose client
        went away at its next token)."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            busy = [s for s in await self.slots() if s.get("id") == slot and s.get("is_processing")]
            if not busy:
                return
            if time.monotonic() > deadline:
                raise BackendError(f"slot {slot} still busy after {self.timeout_s:.0f}s")
            await asyncio.sleep(0.01)

    async def save(self, slot: int, filename: str) -> dict[str, Any]:
        """The server's answer: ``n_saved`` tokens, ``n_written`` bytes."""
        answer = await self._call("POST", f"/slots/{slot}?action=save", {"filename": filename})
        return answer if isinstance(answer, dict) else {}

    async def restore(self, slot: int, filename: str) -> dict[str, Any]:
        """The server's answer: ``n_restored`` tokens, ``n_read`` bytes."""
        answer = await self._call("POST", f"/slots/{slot}?action=restore", {"filename": filename})
        return answer if isinstance(answer, dict) else {}

    async def erase(self, slot: int) -> None:
        await self._call("POST", f"/slots/{slot}?action=erase", {})

    async def detokenize(self, tokens: list[int]) -> str:
        answer = await self._call("POST", "/detokenize", {"tokens": tokens})
        content = answer.get("content") if isinstance(answer, dict) else None
        if not isinstance(content, str):
            raise BackendError("POST /detokenize: no content in the answer")
        return content

    async def apply_template(self, body: dict[str, Any]) -> str:
        """The prompt the server's chat endpoint renders for ``body`` (its messages)."""
        answer = await self._call("POST", "/apply-template", body)
        prompt = answer.get("prompt") if isinstance(answer, dict) else None
        if not isinstance(prompt, str):
            raise BackendError("POST /apply-template: no prompt in the answer")
        return prompt
