"""The llama.cpp component: a GGUF model serving chat and completion, streamed or not."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from accelmux import openai_shapes as shapes
from accelmux.core.types import ServiceKind
from accelmux.errors import BackendError, RequestError
from accelmux.models import llama_buffers, structured
from accelmux.models.assets import gemma3_gguf_path, smollm2_gguf_path
from accelmux.models.chat import LlamaTextModel
from accelmux.models.gguf_profile import gguf_profile, llama_memory_estimate, pad_context
from accelmux.worker.component_base import Component, Slot, StreamControl, json_body

DEFAULT_LLM = {ServiceKind.CHAT: "smollm2", ServiceKind.COMPLETION: "gemma3"}
MIN_CTX = 512
DEFAULT_MAX_TOKENS = 256
#: Sampling penalties passed to llama.cpp (OpenAI's two, and llama.cpp's repeat_penalty).
PENALTIES = ("frequency_penalty", "presence_penalty", "repeat_penalty")


def llm_path(kind: ServiceKind, options: dict[str, Any], model_path: str | None) -> Path:
    if model_path:
        return Path(model_path)
    name = str(options.get("model", DEFAULT_LLM.get(kind, "smollm2")))
    if name == "smollm2":
        return smollm2_gguf_path()
    if name == "gemma3":
        return gemma3_gguf_path()
    raise BackendError(f"unknown packaged model {name!r} (known: smollm2, gemma3)")


def _number(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    try:
        return float(value)
    except (TypeError, ValueError):
        raise RequestError(f"{key} must be a number", field=key) from None


def _gen_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_TOKENS
    stop = body.get("stop") or []
    kwargs: dict[str, Any] = {
        "max_tokens": int(max_tokens),
        "temperature": _number(body, "temperature", 0.7),
        "top_p": _number(body, "top_p", 0.95),
        "stop": [stop] if isinstance(stop, str) else [str(s) for s in stop],
    }
    if body.get("seed") is not None:
        kwargs["seed"] = int(body["seed"])
    penalties = {k: _number(body, k, 0.0) for k in PENALTIES if body.get(k) is not None}
    if penalties:
        kwargs["penalties"] = penalties
    return kwargs


class LlamaComponent(Component):
    """A GGUF model on llama.cpp: chat (with a template) and completion, streamed or not."""

    ctype = "llama"

    def __init__(self, key: str, model_path: str | None, options: dict[str, Any]) -> None:
        super().__init__(key, model_path, options)
        self.model: Any = None
        #: the unloaded model that keeps paused streams for the next load
        self.resting: LlamaTextModel | None = None
        self.kv_per_token = 0

    def _n_ctx(self, slots: list[Slot]) -> int:
        per = max(1, self.kv_per_token)
        wanted = max((s.kv_pool_bytes // per for s in slots), default=0)
        configured = int(self.options.get("n_ctx", 0))
        return pad_context(max(MIN_CTX, wanted or configured or 2048))

    def _load(self, slot: Slot) -> None:
        path = llm_path(slot.kind, self.options, self.model_path)
        profile = gguf_profile(path)
        self.kv_per_token = profile.kv_bytes_per_token
        threads = self.options.get("n_threads")
        n_ctx = self._n_ctx([slot])
        model, self.resting = self.resting, None
        if model is not None and model.model_path.resolve() != path.resolve():
            model.discard(f"{slot.service} now loads {path}: a paused stream cannot continue")
            model = None
        if model is None:
            model = LlamaTextModel(
                path,
                n_ctx=n_ctx,
                n_threads=int(threads) if threads else None,
                n_gpu_layers=self.placement.n_gpu_layers,
                main_gpu=self.placement.gpu_index or 0,
            )
        else:  # its paused streams continue on this load (a context of the new size)
            model.resize_context(n_ctx)
        try:
            model.load()
        except BaseException:
            self.resting = model if model.kept_streams else None
            raise
        self.model = model

    def load(self, slot: Slot) -> None:
        super().load(slot)
        # What the runtime itself allocates: weights from the GGUF file, KV = n_ctx x bytes
        # per token; the rest of the measured growth is runtime (buffers, vocabulary).
        profile = self.model.profile
        self.weights_bytes = int(profile.weights_bytes)
        self.runtime_bytes = max(0, self.load_rss_bytes - self.weights_bytes - self.kv_bytes())

    def runtime_gpu_bytes(self) -> int:
        """llama.cpp's own buffers on the GPU, as it logged them at the load and at the
        last resize (:mod:`accelmux.models.llama_buffers`); when it logged none (another
        llama.cpp), the estimate from the GGUF header: the offloaded share of the
        weights and KV cache (its layers' share; all with ``n_gpu_layers: -1``), the
        compute and output buffers (:func:`llama_memory_estimate`)."""
        if self.model is None or self.model.n_gpu_layers == 0:
            return 0
        if self.model.buffers:
            return llama_buffers.on_gpu(self.model.buffers, self.placement.gpu_index or 0)
        profile = self.model.profile
        estimate = llama_memory_estimate(profile, int(self.model.n_ctx))
        layers = self.model.n_gpu_layers
        share = 1.0 if layers < 0 else min(1.0, layers / max(1, profile.n_layers))
        offloaded = (estimate.weights_bytes + estimate.kv_bytes) * share
        return int(offloaded) + estimate.compute_bytes + estimate.output_bytes

    def live(self) -> dict[str, Any]:
        return {"context_tokens": int(self.model.n_ctx)} if self.model is not None else {}

    def unload(self) -> None:
        model, self.model = self.model, None
        if model is not None:
            model.unload()
            if model.kept_streams:
                self.resting = model

    def kept_streams(self) -> int:
        return self.resting.kept_streams if self.resting is not None else 0

    def discard(self, why: str) -> None:
        resting, self.resting = self.resting, None
        if resting is not None:
            resting.discard(why)

    def weights_file(self) -> Path | None:
        return Path(self.model.model_path) if self.model is not None else None

    def kv_bytes(self) -> int:
        if self.model is None:
            return 0
        return int(self.model.n_ctx) * self.kv_per_token

    def resize(self, slots: list[Slot]) -> bool:
        if self.model is None:
            return False
        target = self._n_ctx(slots)
        if target == self.model.n_ctx:
            return True
        self.model.resize_context(target)
        return True

    def _prompt(
        self, endpoint: str, body: dict[str, Any], plan: structured.OutputPlan | None
    ) -> tuple[bool, Any]:
        if endpoint == "/v1/chat/completions":
            assert plan is not None
            if not self.model.has_chat_template:
                if plan.constrained:
                    field = "tools" if plan.tools else "response_format"
                    raise RequestError(
                        f"{field} needs a chat model; this is a base model without a chat template",
                        field=field,
                    )
                # a base model: continue the conversation as plain text
                messages = structured.prompt_messages(body.get("messages") or [], plan)
                text = "\n".join(f"{m['role']}: {m['content']}" for m in messages)
                return False, text + "\nassistant:"
            return True, structured.prompt_messages(body.get("messages") or [], plan)
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            prompt = "".join(str(p) for p in prompt)
        if not isinstance(prompt, str):
            raise RequestError("prompt must be a string", field="prompt")
        return False, prompt

    def _generate(
        self, chat: bool, prompt: Any, plan: structured.OutputPlan | None, kwargs: dict[str, Any]
    ) -> Any:
        if not chat:
            return self.model.complete(prompt, **kwargs)
        schema = plan.schema if plan is not None else None
        try:
            return self.model.chat(prompt, schema=schema, **kwargs)
        except RequestError as exc:
            if exc.field == "response_format" and plan is not None and plan.tools:
                raise RequestError(str(exc), field="tools") from exc
            raise

    def _plan(self, endpoint: str, body: dict[str, Any]) -> structured.OutputPlan | None:
        if endpoint != "/v1/chat/completions":
            return None
        return structured.plan_output(body)

    def infer(
        self, slot: Slot, endpoint: str, body: dict[str, Any], files: dict[str, bytes]
    ) -> tuple[int, str, bytes, int]:
        if self.model is None:
            raise BackendError("model is not loaded")
        plan = self._plan(endpoint, body)
        chat, prompt = self._prompt(endpoint, body, plan)
        kwargs = _gen_kwargs(body)
        model = str(body.get("model", slot.service))
        rid = f"{slot.service}-{time.monotonic_ns():x}"
        choices: list[dict[str, Any]] = []
        prompt_tokens = completion_tokens = 0
        for index in range(_choices(body)):  # n choices, one generation each
            gen = self._generate(chat, prompt, plan, kwargs)
            prompt_tokens = gen.prompt_tokens
            completion_tokens += gen.completion_tokens
            if plan is None:
                choices.append(
                    {"index": index, "text": gen.text, "finish_reason": gen.finish_reason}
                )
                continue
            content, calls = structured.read_output(plan, gen.text, f"call_{rid}_{index}")
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = [
                    {k: v for k, v in c.items() if k != "index"}
                    for c in structured.tool_calls_json(calls)
                ]
            finish = "tool_calls" if calls else gen.finish_reason
            choices.append({"index": index, "message": message, "finish_reason": finish})
        used = (prompt_tokens + completion_tokens) * self.kv_per_token
        usage = shapes.usage(prompt_tokens, completion_tokens)
        if endpoint == "/v1/chat/completions":
            obj = shapes.chat_completion(model, rid, choices, usage)
        else:
            obj = shapes.text_completion(model, rid, choices, usage)
        return 200, "application/json", json_body(obj), used

    def stream(
        self, slot: Slot, endpoint: str, body: dict[str, Any], control: StreamControl
    ) -> Iterator[bytes]:
        if self.model is None:
            raise BackendError("model is not loaded")
        if _choices(body) > 1:
            raise RequestError("a streamed answer holds one choice here: n must be 1", field="n")
        plan = self._plan(endpoint, body)
        chat, prompt = self._prompt(endpoint, body, plan)
        kwargs = _gen_kwargs(body)
        model = str(body.get("model", slot.service))
        rid = f"{slot.service}-{time.monotonic_ns():x}"
        if plan is not None and plan.tools:
            yield from self._stream_tools(slot, body, prompt, plan, kwargs, model, rid, control)
            return
        is_chat = endpoint == "/v1/chat/completions"
        prompt_tokens = (
            self.model.count_chat_tokens(prompt) if chat else self.model.count_tokens(prompt)
        )
        schema = plan.schema if plan is not None else None
        pieces = (
            self.model.chat_stream(prompt, schema=schema, **kwargs)
            if chat
            else self.model.complete_stream(prompt, **kwargs)
        )
        control.sequence = pieces  # the worker pauses and parks it between chunks
        n = 0
        finish = "stop"
        try:
            first = True
            for piece in pieces:
                if first and is_chat:
                    yield shapes.chat_chunk(model, rid, {"role": "assistant", "content": ""}, None)
                first = False
                n += 1
                control.kv = n * self.kv_per_token
                if is_chat:
                    yield shapes.chat_chunk(model, rid, {"content": piece}, None)
                else:
                    yield shapes.text_chunk(model, rid, piece, None)
                if control.cancelled.is_set():
                    return
            if first and is_chat:
                yield shapes.chat_chunk(model, rid, {"role": "assistant", "content": ""}, None)
        finally:
            pieces.close()  # frees the model for the next request
        if n >= kwargs["max_tokens"]:
            finish = "length"
        if is_chat:
            yield shapes.chat_chunk(model, rid, {}, finish)
        else:
            yield shapes.text_chunk(model, rid, "", finish)
        if shapes.wants_usage(body):
            yield shapes.usage_chunk(model, rid, shapes.usage(prompt_tokens, n), chat=is_chat)
        yield shapes.DONE

    def _stream_tools(
        self,
        slot: Slot,
        body: dict[str, Any],
        prompt: Any,
        plan: structured.OutputPlan,
        kwargs: dict[str, Any],
        model: str,
        rid: str,
        control: StreamControl,
    ) -> Iterator[bytes]:
        """Tools in a stream: the whole output is read first (a call is one JSON object),
        then sent as the deltas OpenAI streams carry."""
        gen = self._generate(True, prompt, plan, kwargs)
        control.kv = (gen.prompt_tokens + gen.completion_tokens) * self.kv_per_token
        content, calls = structured.read_output(plan, gen.text, f"call_{rid}_0")
        yield shapes.chat_chunk(model, rid, {"role": "assistant", "content": ""}, None)
        if calls:
            delta = {"tool_calls": structured.tool_calls_json(calls)}
            yield shapes.chat_chunk(model, rid, delta, None)
        elif content:
            yield shapes.chat_chunk(model, rid, {"content": content}, None)
        yield shapes.chat_chunk(model, rid, {}, "tool_calls" if calls else gen.finish_reason)
        if shapes.wants_usage(body):
            usage = shapes.usage(gen.prompt_tokens, gen.completion_tokens)
            yield shapes.usage_chunk(model, rid, usage)
        yield shapes.DONE


def _choices(body: dict[str, Any]) -> int:
    value = body.get("n")
    return 1 if value is None else max(1, int(value))
