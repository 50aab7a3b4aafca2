"""The models a worker hosts, adapted to OpenAI requests, and how services name them.

Services name a component by :func:`component_key`; two services with the same key share
one loaded copy (see :mod:`accelmux.worker.component_base`). The llama.cpp component is
in :mod:`accelmux.worker.llama_component`; the others (embeddings, speech, detection,
camera frames) are here.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from accelmux import openai_shapes as shapes
from accelmux.core.types import ServiceKind
from accelmux.errors import BackendError, RequestError
from accelmux.models.asr import PocketsphinxRecognizer
from accelmux.models.camera import FrameReader
from accelmux.models.detect import OpenCvDetector
from accelmux.models.embed import MiniLmEmbedder
from accelmux.models.offload import Placement
from accelmux.models.tts import PiperSpeaker
from accelmux.worker.component_base import Component, Slot, json_body
from accelmux.worker.llama_component import LlamaComponent, llm_path
from accelmux.worker.sample_clip import sample_clip


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


def component_key(
    kind: ServiceKind, options: dict[str, Any], model_path: str | None, device: str
) -> str:
    """Services with equal keys share one loaded copy of the model: the same model on
    the same ``device`` (the daemon's device name). Two services with one model file on
    two devices get a copy each, each where its own device is (and each device is
    charged its own copy, as the ledger does: ``WorkerBackendConfig.weights_key``)."""
    ctype = component_type(kind, options)
    if ctype == "llama":
        return f"llama:{llm_path(kind, options, model_path).resolve()}@{device}"
    if model_path:
        return f"{ctype}:{Path(model_path).resolve()}@{device}"
    return f"{ctype}:packaged@{device}"


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
        self._check_providers()

    def _check_providers(self) -> None:
        """ONNX Runtime drops a provider it cannot start (CUDA without its libraries):
        the accelerator then says the model runs on the CPU, and why."""
        running = getattr(self.model, "running_providers", None)
        if not self.placement.on_gpu or not callable(running):
            return
        if "CUDAExecutionProvider" not in running():
            self.placement = Placement(
                accelerator="cpu (fallback: onnxruntime could not start CUDA)",
                fix="check the CUDA and cuDNN libraries onnxruntime-gpu needs (docs/gpu.md)",
            )

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
            model_path=self.model_path,
            n_threads=int(threads) if threads else None,
            providers=self.placement.providers,
        )

    def _serve(
        self, slot: Slot, body: dict[str, Any], files: dict[str, bytes]
    ) -> tuple[int, str, bytes, int]:
        value = body.get("input")
        texts = [value] if isinstance(value, str) else value
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise RequestError("input must be a string or a list of strings", field="input")
        vectors = self.model.embed_array(texts)
        dims = body.get("dimensions")
        if dims is not None and dims != vectors.shape[1]:  # no truncation: refused
            raise RequestError(
                f"this model's embeddings have {vectors.shape[1]} dimensions (asked {dims})",
                field="dimensions",
            )
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
        return 200, "application/json", json_body(obj), 0


class PiperComponent(_ModelComponent):
    ctype = "piper"
    endpoint = "/v1/audio/speech"

    def _make_model(self) -> Any:
        return PiperSpeaker(model_path=self.model_path, providers=self.placement.providers)

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
        return 200, "application/json", json_body(obj), 0


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
        return 200, "application/json", json_body(obj), 0

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
        return 200, "application/json", json_body(obj), 0


COMPONENTS: dict[str, type[Component]] = {
    c.ctype: c
    for c in (LlamaComponent, MiniLmComponent, PiperComponent, SphinxComponent, OpenCvComponent)
}


def make_component(
    kind: ServiceKind,
    options: dict[str, Any],
    model_path: str | None,
    data_dir: Path,
    gpu_index: int | None = None,
    device: str = "",
) -> Component:
    """``gpu_index``: the GPU of the loading service's device (None: the CPU);
    ``device``: that device's name (services share a component only on one device)."""
    ctype = component_type(kind, options)
    cls = COMPONENTS.get(ctype)
    if cls is None:
        raise BackendError(f"no hosted model type {ctype!r} (known: {', '.join(COMPONENTS)})")
    component = cls(component_key(kind, options, model_path, device), model_path, options)
    component.gpu_index = gpu_index
    if isinstance(component, OpenCvComponent):
        component.data_dir = data_dir
    return component
