"""Real model and device sizes the home generator draws from, each with its source.

Sizes are what a home server actually loads: GGUF files at Q4_K_M for LLMs (llama.cpp,
Ollama), fp16 PyTorch or ONNX weights for the rest. The KV cache per token of an LLM is
``2 (K and V) x layers x kv_heads x head_dim x 2 bytes`` (f16), from each model's
``config.json``. A process holds a runtime beside its weights: the CUDA context and
libraries (~300 MiB per process on an NVIDIA GPU, measured with nvidia-smi on an idle
PyTorch or llama.cpp process; ~150 MiB for a Vulkan/ROCm/ONNX Runtime context on a
shared-memory host), plus for llama.cpp its compute buffer at ubatch 512.

Speeds are given on a reference card (an RTX 4070: 504 GB/s, 29.1 FP32 TFLOPS; the
figures in ``scenarios/home-evening.yaml``) and scaled to another device by its spec
sheet: LLM decode is bandwidth-bound (time per token = weights / (bandwidth x 0.45), the
efficiency that gives the measured 22 ms/token of an 8B Q4 model on the reference);
prefill and every other model are compute-bound (scaled by FP32 TFLOPS).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from accelmux.core.types import GIB, MIB

KIB = 1024
GB = 10**9
MB = 10**6

#: The reference device the per-model speeds below were taken on.
REFERENCE_BANDWIDTH_GBS = 504.0
REFERENCE_TFLOPS = 29.1
#: Fraction of the memory bandwidth a Q4 decode step reaches (22 ms/token for 4.92 GB).
DECODE_EFFICIENCY = 0.45
#: Prefill of an 8B model on the reference device, tokens per second.
REFERENCE_PREFILL_8B_TPS = 2500.0


@dataclass(frozen=True, slots=True)
class Llm:
    """A chat model as a Q4_K_M GGUF file."""

    name: str
    params_b: float
    gguf_bytes: int
    layers: int
    kv_heads: int
    head_dim: int
    compute_buffer: int
    source: str

    @property
    def kv_per_token(self) -> int:
        """f16 KV cache bytes per token: 2 x layers x kv_heads x head_dim x 2."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2


ModelKind = Literal["asr", "tts", "image", "detect", "embeddings"]


@dataclass(frozen=True, slots=True)
class Model:
    """A non-LLM model: weights, per-request activations and speed on the reference.

    ``per_unit``: bytes per request unit (second of audio, character, megapixel, text
    chunk of up to 512 tokens); ``base_s`` + ``per_unit_s`` x units is the solo service
    time on the reference device; ``share`` the fraction of its compute one request uses.
    """

    name: str
    kind: ModelKind
    weights: int
    workspace: int
    per_unit: int
    base_s: float
    per_unit_s: float
    share: float
    source: str
    caching_allocator: bool = False


@dataclass(frozen=True, slots=True)
class Device:
    """An accelerator a home server has: an NVIDIA card or a shared-memory host."""

    name: str
    shared_memory: bool
    capacity_gib: float
    bandwidth_gbs: float
    fp32_tflops: float
    source: str

    @property
    def compute_scale(self) -> float:
        return self.fp32_tflops / REFERENCE_TFLOPS

    @property
    def context_bytes(self) -> int:
        """Per-process runtime context: CUDA on a card, Vulkan/ONNX Runtime on a host."""
        return 150 * MIB if self.shared_memory else 300 * MIB


_HF = "https://huggingface.co/"

LLMS: tuple[Llm, ...] = (
    Llm(
        "qwen2.5-0.5b",
        0.49,
        398 * MB,
        24,
        2,
        64,
        70 * MIB,
        _HF + "bartowski/Qwen2.5-0.5B-Instruct-GGUF; config: " + _HF + "Qwen/Qwen2.5-0.5B-Instruct",
    ),
    Llm(
        "qwen2.5-1.5b",
        1.54,
        1120 * MB,
        28,
        2,
        128,
        100 * MIB,
        _HF + "Qwen/Qwen2.5-1.5B-Instruct-GGUF (q4_k_m 1.12 GB)",
    ),
    Llm(
        "qwen2.5-3b",
        3.09,
        1930 * MB,
        36,
        2,
        128,
        150 * MIB,
        _HF + "bartowski/Qwen2.5-3B-Instruct-GGUF; config: " + _HF + "Qwen/Qwen2.5-3B-Instruct",
    ),
    Llm(
        "qwen2.5-7b",
        7.62,
        4680 * MB,
        28,
        4,
        128,
        250 * MIB,
        _HF + "bartowski/Qwen2.5-7B-Instruct-GGUF; config: " + _HF + "Qwen/Qwen2.5-7B-Instruct",
    ),
    Llm(
        "qwen2.5-14b",
        14.8,
        8990 * MB,
        48,
        8,
        128,
        350 * MIB,
        _HF + "bartowski/Qwen2.5-14B-Instruct-GGUF; config: " + _HF + "Qwen/Qwen2.5-14B-Instruct",
    ),
    Llm(
        "llama-3.2-1b",
        1.24,
        808 * MB,
        16,
        8,
        64,
        100 * MIB,
        _HF + "bartowski/Llama-3.2-1B-Instruct-GGUF; config: " + _HF + "meta-llama/Llama-3.2-1B",
    ),
    Llm(
        "llama-3.2-3b",
        3.21,
        2020 * MB,
        28,
        8,
        128,
        150 * MIB,
        _HF + "bartowski/Llama-3.2-3B-Instruct-GGUF; config: " + _HF + "meta-llama/Llama-3.2-3B",
    ),
    Llm(
        "llama-3.1-8b",
        8.03,
        4920 * MB,
        32,
        8,
        128,
        260 * MIB,
        _HF
        + "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF; config: "
        + _HF
        + "meta-llama/Llama-3.1-8B",
    ),
    Llm(
        "gemma-2-2b",
        2.61,
        1710 * MB,
        26,
        4,
        256,
        150 * MIB,
        _HF + "bartowski/gemma-2-2b-it-GGUF; config: " + _HF + "google/gemma-2-2b-it",
    ),
    Llm(
        "gemma-2-9b",
        9.24,
        5760 * MB,
        42,
        8,
        256,
        300 * MIB,
        _HF + "bartowski/gemma-2-9b-it-GGUF; config: " + _HF + "google/gemma-2-9b-it",
    ),
    Llm(
        "mistral-7b-v0.3",
        7.25,
        4370 * MB,
        32,
        8,
        128,
        250 * MIB,
        _HF
        + "bartowski/Mistral-7B-Instruct-v0.3-GGUF; config: "
        + _HF
        + "mistralai/Mistral-7B-Instruct-v0.3",
    ),
    Llm(
        "phi-3.5-mini",
        3.82,
        2390 * MB,
        32,
        32,
        96,
        200 * MIB,
        _HF
        + "bartowski/Phi-3.5-mini-instruct-GGUF; config: "
        + _HF
        + "microsoft/Phi-3.5-mini-instruct",
    ),
)

_WHISPER = "https://github.com/openai/whisper#available-models-and-languages"
_FASTER = "https://github.com/SYSTRAN/faster-whisper (benchmark table, issue #1030)"
_PIPER = _HF + "rhasspy/piper-voices"
_YOLO = "https://docs.ultralytics.com/models/yolov8/#performance-metrics"

MODELS: tuple[Model, ...] = (
    # Whisper (openai, PyTorch fp16): params x 2 bytes; speed relative to small from the
    # README's relative-speed column; encoder activations for the fixed 30 s window scaled
    # by model width from small's 200 MiB.
    Model("whisper-tiny", "asr", 75 * MIB, 80 * MIB, 1 * MIB, 0.04, 0.012, 0.4, _WHISPER),
    Model("whisper-base", "asr", 145 * MIB, 120 * MIB, 1 * MIB, 0.05, 0.017, 0.5, _WHISPER),
    Model("whisper-small", "asr", 470 * MIB, 200 * MIB, 2 * MIB, 0.08, 0.03, 0.6, _WHISPER),
    Model("whisper-medium", "asr", 1470 * MIB, 450 * MIB, 3 * MIB, 0.12, 0.06, 0.8, _WHISPER),
    Model("whisper-large-v3", "asr", 2950 * MIB, 700 * MIB, 4 * MIB, 0.2, 0.12, 1.0, _WHISPER),
    # faster-whisper (CTranslate2 int8): 13 min of audio, beam 5, on a 2080 Ti: large-v3
    # 52.6 s and 2953 MB peak; large-v3-turbo 19.6 s and 1545 MB (minus the context).
    Model(
        "faster-whisper-large-v3-int8",
        "asr",
        1480 * MIB,
        1100 * MIB,
        3 * MIB,
        0.1,
        0.031,
        0.8,
        _FASTER,
    ),
    Model(
        "faster-whisper-turbo-int8",
        "asr",
        775 * MIB,
        400 * MIB,
        2 * MIB,
        0.06,
        0.011,
        0.6,
        _FASTER,
    ),
    # TTS per character: Piper ONNX voices (x_low 16 kHz, medium and high 22 kHz files),
    # Kokoro-82M (fp32 ONNX 310 MB).
    Model("piper-x-low", "tts", 20 * MIB, 24 * MIB, 8 * KIB, 0.02, 0.0004, 0.2, _PIPER),
    Model("piper-medium", "tts", 61 * MIB, 40 * MIB, 16 * KIB, 0.03, 0.0008, 0.3, _PIPER),
    Model("piper-high", "tts", 109 * MIB, 60 * MIB, 24 * KIB, 0.04, 0.0014, 0.4, _PIPER),
    Model(
        "kokoro-82m",
        "tts",
        296 * MIB,
        150 * MIB,
        32 * KIB,
        0.05,
        0.001,
        0.5,
        _HF + "hexgrad/Kokoro-82M; onnx-community/Kokoro-82M-v1.0-ONNX",
    ),
    # Image per megapixel. SD 1.5 fp16 (UNet 860 M + CLIP 123 M + VAE 84 M); SDXL base
    # fp16 UNet + VAE with the text encoders on the CPU; Flux.1 schnell 4 steps as a
    # Q4_K_S GGUF (city96, 6.81 GB) or fp8 (11.9 GB) + CLIP-L + VAE, T5 on the CPU.
    Model(
        "sd-1.5",
        "image",
        2030 * MIB,
        400 * MIB,
        1024 * MIB,
        0.5,
        4.5,
        1.0,
        _HF + "stable-diffusion-v1-5/stable-diffusion-v1-5",
        caching_allocator=True,
    ),
    Model(
        "sdxl-1.0",
        "image",
        int(4.95 * GIB),
        500 * MIB,
        int(1.2 * GIB),
        1.0,
        6.0,
        1.0,
        _HF + "stabilityai/stable-diffusion-xl-base-1.0",
        caching_allocator=True,
    ),
    Model(
        "flux-schnell-q4",
        "image",
        6900 * MIB,
        600 * MIB,
        int(1.5 * GIB),
        1.0,
        5.0,
        1.0,
        _HF + "city96/FLUX.1-schnell-gguf",
        caching_allocator=True,
    ),
    Model(
        "flux-schnell-fp8",
        "image",
        11750 * MIB,
        600 * MIB,
        int(1.5 * GIB),
        1.0,
        4.0,
        1.0,
        _HF + "Comfy-Org/flux1-schnell (flux1-schnell-fp8.safetensors)",
        caching_allocator=True,
    ),
    # Detection per megapixel (a 640x640 frame is 0.41 MP): YOLOv8 n/s/m, fp32 weights
    # (3.2 M / 11.2 M / 25.9 M params), time scaled by FLOPs (8.7 / 28.6 / 78.9 G).
    Model("yolov8n", "detect", 13 * MIB, 40 * MIB, 40 * MIB, 0.003, 0.008, 0.15, _YOLO),
    Model("yolov8s", "detect", 45 * MIB, 60 * MIB, 80 * MIB, 0.004, 0.02, 0.25, _YOLO),
    Model("yolov8m", "detect", 104 * MIB, 90 * MIB, 160 * MIB, 0.006, 0.05, 0.35, _YOLO),
    # Embeddings per text chunk (<= 512 tokens), fp32 weights.
    Model(
        "all-minilm-l6-v2",
        "embeddings",
        87 * MIB,
        48 * MIB,
        2 * MIB,
        0.008,
        0.002,
        0.6,
        _HF + "sentence-transformers/all-MiniLM-L6-v2 (22.7 M params)",
    ),
    Model(
        "bge-small-en-v1.5",
        "embeddings",
        128 * MIB,
        64 * MIB,
        3 * MIB,
        0.01,
        0.004,
        0.7,
        _HF + "BAAI/bge-small-en-v1.5 (33.4 M params)",
        caching_allocator=True,
    ),
    Model(
        "bge-base-en-v1.5",
        "embeddings",
        418 * MIB,
        96 * MIB,
        6 * MIB,
        0.012,
        0.012,
        0.8,
        _HF + "BAAI/bge-base-en-v1.5 (109 M params)",
        caching_allocator=True,
    ),
    Model(
        "nomic-embed-text-v1.5",
        "embeddings",
        522 * MIB,
        128 * MIB,
        8 * MIB,
        0.015,
        0.016,
        0.8,
        _HF + "nomic-ai/nomic-embed-text-v1.5 (137 M params)",
        caching_allocator=True,
    ),
)

_NV = "https://www.nvidia.com/en-us/geforce/graphics-cards/ (spec sheets)"

DEVICES: tuple[Device, ...] = (
    Device("RTX 2060 6GB", False, 6, 336, 6.45, _NV),
    Device("RTX 4060 8GB", False, 8, 272, 15.1, _NV),
    Device("RTX 3060 12GB", False, 12, 360, 12.7, _NV),
    Device("RTX 4070 12GB", False, 12, 504, 29.1, _NV),
    Device("RTX 4060 Ti 16GB", False, 16, 288, 22.1, _NV),
    Device("RTX 4080 16GB", False, 16, 717, 48.7, _NV),
    Device("RTX 3090 24GB", False, 24, 936, 35.6, _NV),
    Device("RTX 4090 24GB", False, 24, 1008, 82.6, _NV),
    Device(
        "RTX A6000 48GB",
        False,
        48,
        768,
        38.7,
        "https://www.nvidia.com/en-us/design-visualization/rtx-a6000/",
    ),
    Device(
        "Jetson Orin Nano 8GB",
        True,
        8,
        68,
        1.28,
        "https://developer.nvidia.com/embedded/jetson-modules",
    ),
    Device(
        "Jetson Orin NX 16GB",
        True,
        16,
        102,
        1.88,
        "https://developer.nvidia.com/embedded/jetson-modules",
    ),
    Device(
        "Ryzen 7 8845HS / Radeon 780M, 32 GB DDR5-5600",
        True,
        32,
        90,
        8.9,
        "https://www.amd.com/en/products/processors/laptop/ryzen/8000-series/amd-ryzen-7-8845hs.html",
    ),
    Device(
        "Jetson AGX Orin 32GB",
        True,
        32,
        205,
        5.3,
        "https://developer.nvidia.com/embedded/jetson-modules",
    ),
    Device("Mac mini M4 24GB", True, 24, 120, 4.3, "https://www.apple.com/mac-mini/specs/"),
)


def llm(name: str) -> Llm:
    return next(m for m in LLMS if m.name == name)


def model(name: str) -> Model:
    return next(m for m in MODELS if m.name == name)


def models_of(kind: ModelKind) -> tuple[Model, ...]:
    return tuple(m for m in MODELS if m.kind == kind)
