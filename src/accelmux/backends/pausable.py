"""A streamed completion that can be paused between tokens and resumed with nothing lost
or repeated: llama-server's native ``/completion`` behind the OpenAI endpoints.

llama-server cannot pause a running generation. A pause therefore ends the upstream
request at a token boundary while the client's stream to accelmux stays open and sends
nothing; the resume sends a new upstream request whose prompt is the original prompt
followed by the ids of the tokens generated so far (a mixed prompt: the prompt text, then
ids, so the prompt is tokenized exactly as the first time), asking only for the tokens
still to come, and relays only the new ones. llama-server's prompt cache finds those
tokens in the slot (kept there, or restored from a saved slot file) and evaluates only
the last one again; a slot that holds other tokens (taken by another request meanwhile)
costs a recomputation of the prompt, never a different output.

The boundary is clean: the text relayed so far is exactly what the generated tokens spell
(``/detokenize``), so the server holds back nothing (the start of a stop string, part of
a UTF-8 character) that the cancelled request would have sent later; a pause asked at an
unclean boundary takes effect at the next clean one. A request still evaluating its
prompt pauses after its first token.

Which requests (:func:`why_not_pausable`): streamed ``/v1/completions`` with one prompt (a
string or token ids), and streamed ``/v1/chat/completions`` whose messages the server
renders with ``/apply-template`` (the prompt its chat endpoint would build) and that name
no tools, response format or log probabilities; the chat text is the model's raw output,
not parsed for reasoning or tool calls. Any other request goes through as it is and
cannot be paused.

What stays identical: with greedy sampling (``temperature: 0``) the resumed output is the
one an unpaused run gives, token for token (up to floating-point differences between
evaluating the last token alone and in a batch). Repetition penalties see the same token
history (the server feeds a prompt's tokens to its samplers). With a temperature above 0
a ``seed`` makes each run reproducible, but the sampler's random state starts again at
the resume, so a paused run draws differently from an unpaused one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from enum import StrEnum
from typing import Any

import aiohttp

from accelmux import openai_shapes as shapes
from accelmux.backends.base import BackendRequest, BackendResponse
from accelmux.backends.llama_slots import LlamaServerClient
from accelmux.backends.process_meter import PeakTracker
from accelmux.errors import BackendCrashedError, BackendError, BackendTimeoutError

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
#: Request fields this path cannot reproduce: a request naming one is not pausable.
UNSUPPORTED = frozenset(
    {
        "best_of",
        "echo",
        "logprobs",
        "top_logprobs",
        "suffix",
        "logit_bias",
        "tools",
        "tool_choice",
        "functions",
        "function_call",
        "response_format",
    }
)
#: OpenAI fields that are not sampling settings (or that this path sets itself).
NOT_SAMPLING = frozenset(
    {
        "model",
        "prompt",
        "messages",
        "stream",
        "stream_options",
        "n",
        "user",
        "max_tokens",
        "max_completion_tokens",
        "n_predict",
        "id_slot",
        "cache_prompt",
        "return_tokens",
        "chat_template_kwargs",
    }
)


def why_not_pausable(request: BackendRequest) -> str | None:
    """Why this path cannot serve ``request`` (and so pause it), or None when it can."""
    body = request.body
    if not request.stream or request.files:
        return "not a stream"
    if request.endpoint not in (COMPLETIONS, CHAT):
        return f"{request.endpoint} is not {COMPLETIONS} or {CHAT}"
    named = sorted(key for key in UNSUPPORTED if body.get(key) not in (None, False))
    if named:
        return f"it names {', '.join(named)}"
    if body.get("n") not in (None, 1):
        return "it asks for more than one choice"
    if request.endpoint == CHAT:
        return None if isinstance(body.get("messages"), list) else "no messages"
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (
        isinstance(prompt, list) and bool(prompt) and all(type(t) is int for t in prompt)
    ):
        return None
    return "its prompt is not one string or one list of token ids"


def sampling(body: dict[str, Any]) -> dict[str, Any]:
    """The request's sampling settings as ``/completion`` reads them (the same names;
    a single ``stop`` string becomes a list)."""
    out = {k: v for k, v in body.items() if k not in NOT_SAMPLING and not k.startswith("_")}
    if isinstance(out.get("stop"), str):
        out["stop"] = [out["stop"]]
    return out


class Phase(StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    DONE = "done"


class PausableCompletion:
    """One request on this path: its upstream segments, its tokens, its state."""

    def __init__(
        self,
        request: BackendRequest,
        *,
        client: LlamaServerClient,
        session: Callable[[], aiohttp.ClientSession],
        base_url: Callable[[], str],
        slot: int,
        peaks: PeakTracker,
        kv_bytes_per_token: int,
        on_end: Callable[[PausableCompletion], None],
    ) -> None:
        self.request = request
        self.request_id = request.request_id
        self.chat = request.endpoint == CHAT
        self.model = str(request.body.get("model") or request.service)
        self.params = sampling(request.body)
        limit = request.body.get("max_completion_tokens") or request.body.get("max_tokens")
        self.max_tokens: int | None = int(limit) if limit else None
        self.prompt: str | list[int] = request.body.get("prompt") or ""
        self.slot = slot
        self.tokens: list[int] = []
        self.text: list[str] = []
        self.prompt_tokens: int | None = None
        self.phase = Phase.RUNNING
        self.parked: str | None = None  #: the slot file's name while parked
        self.segments = 0
        #: Boundaries a pause went past because the server held text back there.
        self.held_back = 0
        self._client = client
        self._session = session
        self._base_url = base_url
        self._peaks = peaks
        self._kv_bytes_per_token = kv_bytes_per_token
        self._on_end = on_end
        self._want_pause = False
        self._stopped = asyncio.Event()  # set when the relay paused or ended
        self._resume = asyncio.Event()
        self._resp: aiohttp.ClientResponse | None = None
        self._final: dict[str, Any] | None = None
        self._growth = 0
        #: What the reader got for the client: chunks, then None (the end) or an error.
        self._out: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()
        self._reader: asyncio.Task[None] | None = None
        self.response = BackendResponse(content_type="text/event-stream", release=self._release)

    # ---- the client's side ----------------------------------------------------------
    async def open(self) -> BackendResponse:
        """Send the first segment; an upstream refusal is answered as it is."""
        try:
            if self.chat:
                template = {"messages": self.request.body["messages"]}
                kwargs = self.request.body.get("chat_template_kwargs")
                if isinstance(kwargs, dict):
                    template["chat_template_kwargs"] = kwargs
                self.prompt = await self._client.apply_template(template)
            resp = await self._post()
        except BaseException:
            self._end()
            raise
        if resp.status != 200:
            try:
                body = await resp.read()
            finally:
                resp.release()
                self._end()
            return BackendResponse(
                status=resp.status,
                content_type=resp.headers.get("Content-Type", "application/json"),
                body=body,
            )
        self._resp = resp
        self._reader = asyncio.create_task(self._read(), name=f"upstream {self.request_id}")
        self.response.stream = self._stream()
        return self.response

    async def _stream(self) -> AsyncIterator[bytes]:
        """The client's stream: what the reader queued, as fast as the client takes it."""
        try:
            while True:
                item = await self._out.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            await self._stop_reader()

    async def _read(self) -> None:
        """Read the upstream segments (independently of the client's pace, so that a
        pause never waits for a slow client), pausing between them when asked."""
        try:
            if self.chat:
                role = {"role": "assistant", "content": ""}
                self._out.put_nowait(shapes.chat_chunk(self.model, self.request_id, role, None))
            while True:
                await self._read_segment()
                if self._final is not None:
                    break
                self.phase = Phase.PAUSED
                self._stopped.set()
                await self._resume.wait()
                self._resume.clear()
                self._resp = await self._post_resumed()
            closing = self._closing_chunks(self._final)
            self._end()  # the peak is known before the client sees the end
            for chunk in closing:
                self._out.put_nowait(chunk)
            self._out.put_nowait(None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._out.put_nowait(exc)
        finally:
            if self._resp is not None:
                self._resp.close()
                self._resp = None
            self._end()

    async def _stop_reader(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None and not reader.done():
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        self._end()

    def _closing_chunks(self, final: dict[str, Any]) -> list[bytes]:
        finish = "length" if final.get("stop_type") == "limit" else "stop"
        if self.chat:
            out = [shapes.chat_chunk(self.model, self.request_id, {}, finish)]
        else:
            out = [shapes.text_chunk(self.model, self.request_id, "", finish)]
        if shapes.wants_usage(self.request.body):
            used = shapes.usage(self.prompt_tokens or 0, len(self.tokens))
            out.append(shapes.usage_chunk(self.model, self.request_id, used, chat=self.chat))
        out.append(shapes.DONE)
        return out

    def _piece(self, text: str) -> bytes:
        if self.chat:
            return shapes.chat_chunk(self.model, self.request_id, {"content": text}, None)
        return shapes.text_chunk(self.model, self.request_id, text, None)

    # ---- the upstream side ----------------------------------------------------------
    def _prompt_now(self) -> str | list[str | int]:
        if not self.tokens:
            return [*self.prompt] if isinstance(self.prompt, list) else self.prompt
        head: list[str | int] = [self.prompt] if isinstance(self.prompt, str) else [*self.prompt]
        return [*head, *self.tokens]

    async def _post(self) -> aiohttp.ClientResponse:
        remaining = -1 if self.max_tokens is None else self.max_tokens - len(self.tokens)
        body = {
            **self.params,
            "prompt": self._prompt_now(),
            "n_predict": remaining,
            "stream": True,
            "return_tokens": True,
            "cache_prompt": True,
            "id_slot": self.slot,
        }
        self.segments += 1
        try:
            # llama-server closes a stream's connection right after it (though it says
            # keep-alive): one reused at that moment fails the next request.
            return await self._session().post(
                self._base_url() + "/completion", json=body, headers={"Connection": "close"}
            )
        except TimeoutError:  # before ClientError: aiohttp's timeouts are both
            raise BackendTimeoutError("upstream timed out") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise BackendCrashedError(f"upstream unreachable: {exc}") from None

    async def _post_resumed(self) -> aiohttp.ClientResponse | None:
        if self.max_tokens is not None and len(self.tokens) >= self.max_tokens:
            self._final = {"stop_type": "limit"}  # paused right after its last token
            return None
        resp = await self._post()
        if resp.status != 200:
            text = (await resp.read())[:300].decode("utf-8", "replace")
            resp.release()
            raise BackendError(f"the resumed request was refused: HTTP {resp.status}: {text}")
        return resp

    async def _read_segment(self) -> None:
        """One segment: queue its text until it ends, or until a pause finds a clean
        boundary (then the upstream connection is closed: the server cancels it)."""
        resp = self._resp
        if resp is None:
            return
        self._resp = None
        token = self._peaks.begin()
        before = len(self.tokens)
        try:
            async for line in resp.content:
                if self._final is not None:
                    continue  # the rest of the answer, to its end
                if line.startswith(b"error:"):
                    raise BackendError(f"upstream error: {line[6:300].decode('utf-8', 'replace')}")
                if not line.startswith(b"data: "):
                    continue
                event = json.loads(line[6:])
                if self.prompt_tokens is None and "tokens_evaluated" in event:
                    self.prompt_tokens = int(event["tokens_evaluated"]) - before
                self.tokens.extend(int(t) for t in event.get("tokens") or ())
                text = event.get("content") or ""
                if text:
                    self.text.append(text)
                    self._out.put_nowait(self._piece(text))
                if event.get("stop"):
                    self._final = event
                elif self._want_pause and await self._clean():
                    return
            if self._final is None:
                raise BackendCrashedError("the upstream stream ended without its last event")
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise BackendCrashedError(f"stream broke off: {exc}") from None
        finally:
            resp.close()
            self._growth = max(self._growth, self._peaks.end(token))

    async def _clean(self) -> bool:
        """Whether the text relayed is all the generated tokens spell (nothing held back)."""
        if not self.tokens:
            return True
        try:
            clean = await self._client.detokenize(self.tokens) == "".join(self.text)
        except BackendError:
            clean = False
        self.held_back += not clean
        return clean

    # ---- pause and resume -------------------------------------------------------------
    async def pause(self, timeout_s: float) -> bool:
        """Stop at the next clean token boundary; False when the request ended first."""
        if self.phase is not Phase.RUNNING:
            return self.is_paused
        self._want_pause = True
        try:
            await asyncio.wait_for(self._stopped.wait(), timeout_s)
        except TimeoutError:
            if not self.is_paused:
                raise BackendError(
                    f"{self.request_id}: no clean token boundary within {timeout_s:.0f}s"
                ) from None
        finally:
            self._want_pause = False
        return self.is_paused

    @property
    def is_paused(self) -> bool:
        return self.phase is Phase.PAUSED

    def resume(self) -> None:
        """Let the relay go on (it sends the next segment). Running at once, so that a
        pause asked next waits for the new segment's boundary."""
        if self.phase is Phase.PAUSED:
            self.phase = Phase.RUNNING
            self._stopped.clear()
            self._resume.set()

    # ---- the end ---------------------------------------------------------------------
    def abort(self, why: str) -> None:
        """End it now (accelmux is closing the backend): the client's stream ends with
        ``why``."""
        if self.phase is not Phase.DONE:
            self._out.put_nowait(BackendCrashedError(why))
        if self._reader is not None:
            self._reader.cancel()

    @property
    def last_segment_timings(self) -> dict[str, Any]:
        """The server's timings of the last segment (``cache_n``: prompt tokens found in
        the slot, ``prompt_n``: evaluated), when it ended."""
        timings = (self._final or {}).get("timings")
        return timings if isinstance(timings, dict) else {}

    def _release(self) -> None:
        """The stream was never consumed: stop reading upstream."""
        if self._reader is not None:
            self._reader.cancel()
        self._end()

    def _end(self) -> None:
        if self.phase is Phase.DONE:
            return
        self.phase = Phase.DONE
        self._stopped.set()
        if self._final is not None:
            total = (self.prompt_tokens or 0) + len(self.tokens)
            self.response.peak_bytes = self._growth + total * self._kv_bytes_per_token
        self._on_end(self)
