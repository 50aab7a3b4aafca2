"""The models a worker hosts, adapted to OpenAI requests, with their memory accounts.

A :class:`Component` is one loaded model (one copy of a model file). Services name a
component by :func:`component_key`; two services with the same key share one loaded
copy (the worker refcounts it). Every model call of a component runs on that
component's own thread, so a component never sees two calls at once.

Memory per component, reported to the daemon:

* LLMs (llama.cpp): ``weights`` = the GGUF tensor bytes, ``kv`` = ``n_ctx x`` KV bytes
  per token (both what the runtime allocates), ``runtime`` = the rest of the RSS the
  load added (measured);
* the others: ``runtime`` = RSS the runtime's first import added (libraries: zero when
  another component already imported them), ``weights`` = RSS the load added.
"""

from __future__ import annotations

import base64
import contextlib
import importlib
import json
import resource
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from accelmux import openai_shapes as shapes
from accelmux.core.types import ServiceKind
from accelmux.errors import BackendError, RequestError
from accelmux.models import structured
from accelmux.models.asr import PocketsphinxRecognizer
from accelmux.models.assets import gemma3_gguf_path, smollm2_gguf_path
from accelmux.models.camera import FrameReader
from accelmux.models.chat import LlamaTextModel
from accelmux.models.detect import OpenCvDetector
from accelmux.models.embed import MiniLmEmbedder
from accelmux.models.gguf_profile import gguf_profile, pad_context
from accelmux.models.tts import PiperSpeaker
from accelmux.worker.sample_clip import sample_clip

#: Modules each kind of component imports (their first import is the "runtime" cost).
RUNTIME_MODULES: dict[str, tuple[str, ...]] = {
    "llama": ("numpy", "llama_cpp"),
    "minilm": ("numpy", "onnxruntime", "tokenizers"),
    "piper": ("numpy", "onnxruntime", "piper"),
    "pocketsphinx": ("numpy", "pocketsphinx"),
    "opencv": ("numpy", "cv2"),
}
DEFAULT_LLM = {ServiceKind.CHAT: "smollm2", ServiceKind.COMPLETION: "gemma3"}
MIN_CTX = 512
DEFAULT_MAX_TOKENS = 256
#: Sampling penalties passed to llama.cpp (OpenAI's two, and llama.cpp's repeat_penalty).
PENALTIES = ("frequency_penalty", "presence_penalty", "repeat_penalty")


def rss_bytes() -> int:
    """This process's resident set size (``/proc/self/statm``, cheap to read)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            pages = int(fh.read().split()[1])
        return pages * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return int(psutil.Process().memory_info().rss)


@dataclass
class Slot:
    """One service's hold on a component, and its per-service state (camera readers)."""

    service: str
    kind: ServiceKind
    options: dict[str, Any]
    kv_pool_bytes: int = 0
    state: dict[str, Any] = field(default_factory=dict)


def llm_path(kind: ServiceKind, options: dict[str, Any], model_path: str | None) -> Path:
    if model_path:
        return Path(model_path)
    name = str(options.get("model", DEFAULT_LLM.get(kind, "smollm2")))
    if name == "smollm2":
        return smollm2_gguf_path()
    if name == "gemma3":
        return gemma3_gguf_path()
    raise BackendError(f"unknown packaged model {name!r} (known: smollm2, gemma3)")


def component_type(kind: ServiceKind, options: dict[str, Any]) -> str:
    explicit = options.get("model_type")
    if explicit:
        return str(explicit)
    return {
        ServiceKind.CHAT: "llama",
        ServiceKind.COMPLETION: "llama",
        ServiceKind.EMBEDDINGS: "minilm",
        ServiceKind.TTS: "piper",
        ServiceKind.ASR: "pocketsphinx",
        ServiceKind.DETECT: "opencv",
        ServiceKind.CAMERA: "opencv",
    }.get(kind, kind.value)


def component_key(kind: ServiceKind, options: dict[str, Any], model_path: str | None) -> str:
    """Services with equal keys share one loaded copy of the model."""
    ctype = component_type(kind, options)
    if ctype == "llama":
        return f"llama:{llm_path(kind, options, model_path).resolve()}"
    if model_path:
        return f"{ctype}:{Path(model_path).resolve()}"
    return f"{ctype}:packaged"


class Component:
    """Base: one model; subclasses implement ``_load``, ``_unload`` and the endpoints."""

    ctype = ""

    def __init__(self, key: str, model_path: str | None, options: dict[str, Any]) -> None:
        self.key = key
        self.model_path = model_path
        self.options = options
        self.weights_bytes = 0
        self.runtime_bytes = 0
        self.load_rss_bytes = 0
        self.load_seconds = 0.0

    # -- lifecycle ----------------------------------------------------------------------
    def load(self, slot: Slot) -> None:
        before = rss_bytes()
        for module in RUNTIME_MODULES.get(self.ctype, ()):
            if module not in sys.modules:
                # a missing package: the wrapper's load names it
                with contextlib.suppress(ImportError):
                    importlib.import_module(module)
        imported = rss_bytes()
        started = time.perf_counter()
        self._load(slot)
        self.load_seconds = time.perf_counter() - started
        after = rss_bytes()
        self.load_rss_bytes = after - before
        self.runtime_bytes = max(0, imported - before)
        self.weights_bytes = max(0, after - imported)

    def _load(self, slot: Slot) -> None:
        raise NotImplementedError

    def unload(self) -> None:
        raise NotImplementedError

    def kv_bytes(self) -> int:
        return 0

    def resize(self, slots: list[Slot]) -> bool:
        """Apply the KV pools the slots ask for; False when there is nothing to resize."""
        return False

    def release(self, slot: Slot) -> None:
        """A service lets go of this component (per-service state is closed)."""

    # -- requests -----------------------------------------------------------------------
    def infer(
        self, slot: Slot, endpoint: str, body: dict[str, Any], files: dict[str, bytes]
    ) -> tuple[int, str, bytes, int]:
        """(status, content type, body, extra peak bytes beyond the RSS growth)."""
        raise BackendError(f"{self.ctype} serves no endpoint {endpoint}")

    def stream(
        self,
        slot: Slot,
        endpoint: str,
        body: dict[str, Any],
        cancelled: threading.Event,
        extra: dict[str, int],
    ) -> Iterator[bytes]:
        raise RequestError(f"{endpoint} cannot stream here", field="stream")


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


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
        model = LlamaTextModel(
            path, n_ctx=self._n_ctx([slot]), n_threads=int(threads) if threads else None
        )
        model.load()
        self.model = model

    def load(self, slot: Slot) -> None:
        super().load(slot)
        # What the runtime itself allocates: weights from the GGUF file, KV = n_ctx x bytes
        # per token; the rest of the measured growth is runtime (buffers, vocabulary).
        profile = self.model.profile
        self.weights_bytes = int(profile.weights_bytes)
        self.runtime_bytes = max(0, self.load_rss_bytes - self.weights_bytes - self.kv_bytes())

    def unload(self) -> None:
        model, self.model = self.model, None
        if model is not None:
            model.unload()

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
        return 200, "application/json", _json(obj), used

    def stream(
        self,
        slot: Slot,
        endpoint: str,
        body: dict[str, Any],
        cancelled: threading.Event,
        extra: dict[str, int],
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
            yield from self._stream_tools(slot, body, prompt, plan, kwargs, model, rid, extra)
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
        n = 0
        finish = "stop"
        try:
            first = True
            for piece in pieces:
                if first and is_chat:
                    yield shapes.chat_chunk(model, rid, {"role": "assistant", "content": ""}, None)
                first = False
                n += 1
                extra["kv"] = n * self.kv_per_token
                if is_chat:
                    yield shapes.chat_chunk(model, rid, {"content": piece}, None)
                else:
                    yield shapes.text_chunk(model, rid, piece, None)
                if cancelled.is_set():
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
        extra: dict[str, int],
    ) -> Iterator[bytes]:
        """Tools in a stream: the whole output is read first (a call is one JSON object),
        then sent as the deltas OpenAI streams carry."""
        gen = self._generate(True, prompt, plan, kwargs)
        extra["kv"] = (gen.prompt_tokens + gen.completion_tokens) * self.kv_per_token
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


class _ModelComponent(Component):
    """One model object with ``load()`` and ``unload()``, serving one endpoint."""

    #: The endpoint :meth:`_serve` answers; others go to :meth:`Component.infer`.
    endpoint = ""

    def __init__(self, key: str, model_path: str | None, options: dict[str, Any]) -> None:
        super().__init__(key, model_path, options)
        self.model: Any = None

    def _make_model(self) -> Any:
        raise NotImplementedError

    def _load(self, slot: Slot) -> None:
        model = self._make_model()
        model.load()
        self.model = model

    def unload(self) -> None:
        if self.model is not None:
            self.model.unload()
        self.model = None

    def infer(
        self, slot: Slot, endpoint: str, body: dict[str, Any], files: dict[str, bytes]
    ) -> tuple[int, str, bytes, int]:
        if endpoint != self.endpoint:
            return super().infer(slot, endpoint, body, files)
        return self._serve(slot, body, files)

    def _serve(
        self, slot: Slot, body: dict[str, Any], files: dict[str, bytes]
    ) -> tuple[int, str, bytes, int]:
        raise NotImplementedError


class MiniLmComponent(_ModelComponent):
    ctype = "minilm"
    endpoint = "/v1/embeddings"

    def _make_model(self) -> Any:
        threads = self.options.get("n_threads")
        return MiniLmEmbedder(
            model_path=self.model_path, n_threads=int(threads) if threads else None
        )

    def _serve(
        self, slot: Slot, body: dict[str, Any], files: dict[str, bytes]
    ) -> tuple[int, str, bytes, int]:
        value = body.get("input")
        texts = [value] if isinstance(value, str) else value
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise RequestError("input must be a string or a list of strings", field="input")
        vectors = self.model.embed_array(texts)
        b64 = body.get("encoding_format") == "base64"
        data: list[Any] = [
            base64.b64encode(row.astype("<f4").tobytes()).decode()
            if b64
            else [round(float(x), 7) for x in row]
            for row in vectors
        ]
        tokens = sum(self.model.count_tokens(t) for t in texts)
        model = str(body.get("model", slot.service))
        obj = shapes.embeddings_list(model, data, shapes.embedding_usage(tokens))
        return 200, "application/json", _json(obj), 0


class PiperComponent(_ModelComponent):
    ctype = "piper"
    endpoint = "/v1/audio/speech"

    def _make_model(self) -> Any:
        return PiperSpeaker(model_path=self.model_path)

    def _serve(
        self, slot: Slot, body: dict[str, Any], files: dict[str, bytes]
    ) -> tuple[int, str, bytes, int]:
        fmt = body.get("response_format") or "wav"
        if fmt not in ("wav", "pcm"):
            raise RequestError(
                f"response_format {fmt!r} is not supported (wav or pcm)", field="response_format"
            )
        speech = self.model.synthesize(str(body.get("input", "")))
        if fmt == "pcm":
            return 200, "audio/pcm", speech.wav[44:], 0
        return 200, "audio/wav", speech.wav, 0


class SphinxComponent(_ModelComponent):
    ctype = "pocketsphinx"
    endpoint = "/v1/audio/transcriptions"

    def _make_model(self) -> Any:
        return PocketsphinxRecognizer()

    def _serve(
        self, slot: Slot, body: dict[str, Any], files: dict[str, bytes]
    ) -> tuple[int, str, bytes, int]:
        audio = files.get("file")
        if not audio:
            raise RequestError("file (a WAV) is required", field="file")
        transcript = self.model.transcribe(audio)
        fmt = body.get("response_format") or "json"
        if fmt == "text":
            return 200, "text/plain", transcript.text.encode(), 0
        obj: dict[str, Any] = {"text": transcript.text}
        if fmt == "verbose_json":
            obj.update(task="transcribe", language="english", duration=transcript.duration_s)
        return 200, "application/json", _json(obj), 0


class OpenCvComponent(_ModelComponent):
    """Face + person detection; also reads camera frames for camera services."""

    ctype = "opencv"
    endpoint = "/v1/detections"

    def __init__(self, key: str, model_path: str | None, options: dict[str, Any]) -> None:
        super().__init__(key, model_path, options)
        self.data_dir: Path = Path(".")

    def _make_model(self) -> Any:
        return OpenCvDetector(cascade_path=self.model_path)

    def release(self, slot: Slot) -> None:
        reader = slot.state.pop("reader", None)
        if reader is not None:
            reader.close()
        slot.state.clear()

    def _labels(self, body: dict[str, Any]) -> list[str]:
        labels = body.get("labels") or ["face", "person"]
        if isinstance(labels, str):
            labels = [x.strip() for x in labels.split(",") if x.strip()]
        return [str(x) for x in labels]

    @staticmethod
    def _boxes(found: list[Any]) -> list[dict[str, Any]]:
        return [
            {"label": d.label, "score": d.score, "box": [d.x, d.y, d.x + d.w, d.y + d.h]}
            for d in found
        ]

    def infer(
        self, slot: Slot, endpoint: str, body: dict[str, Any], files: dict[str, bytes]
    ) -> tuple[int, str, bytes, int]:
        if endpoint == "/camera/frame":
            return self._camera_frame(slot, body)
        return super().infer(slot, endpoint, body, files)

    def _serve(
        self, slot: Slot, body: dict[str, Any], files: dict[str, bytes]
    ) -> tuple[int, str, bytes, int]:
        image = files.get("image") or b""
        decoded = self.model.decode(image)
        found = self.model.detect_array(decoded, self._labels(body))
        obj = {
            "object": "detection",
            "model": str(body.get("model", slot.service)),
            "width": int(decoded.shape[1]),
            "height": int(decoded.shape[0]),
            "detections": self._boxes(found),
        }
        return 200, "application/json", _json(obj), 0

    def _camera_frame(self, slot: Slot, body: dict[str, Any]) -> tuple[int, str, bytes, int]:
        frames = slot.state.get("frames")
        if frames is None:
            source = str(body.get("source") or slot.options.get("source") or "sample")
            if source == "sample":
                source = str(sample_clip(self.data_dir))
            fps = float(body.get("fps") or slot.options.get("fps") or 1.0)
            reader = FrameReader(source, fps=fps, pace=False, loop=True)
            slot.state["reader"] = reader
            frames = slot.state["frames"] = iter(reader.frames())
        try:
            frame = next(frames)
        except StopIteration:
            self.release(slot)
            raise BackendError("the camera source ended") from None
        found = self.model.detect_array(frame.image, self._labels(body))
        obj = {
            "camera": slot.service,
            "frame": frame.index,
            "timestamp_s": round(frame.timestamp_s, 3),
            "width": frame.width,
            "height": frame.height,
            "detections": self._boxes(found),
        }
        return 200, "application/json", _json(obj), 0


COMPONENTS: dict[str, type[Component]] = {
    c.ctype: c
    for c in (LlamaComponent, MiniLmComponent, PiperComponent, SphinxComponent, OpenCvComponent)
}


def make_component(
    kind: ServiceKind, options: dict[str, Any], model_path: str | None, data_dir: Path
) -> Component:
    ctype = component_type(kind, options)
    cls = COMPONENTS.get(ctype)
    if cls is None:
        raise BackendError(f"no hosted model type {ctype!r} (known: {', '.join(COMPONENTS)})")
    component = cls(component_key(kind, options, model_path), model_path, options)
    if isinstance(component, OpenCvComponent):
        component.data_dir = data_dir
    return component
