"""Where a worker-hosted model runs: on its service's GPU, or on the CPU (and why).

A service whose device is ``nvidia`` runs its model on that GPU when the runtime can:

* llama.cpp: every layer offloaded (``n_gpu_layers: -1``; a service may set a number in
  its backend ``options``) to GPU ``index`` (``main_gpu``, one GPU: no split), when the
  installed llama-cpp-python was built with GPU support
  (``llama_cpp.llama_supports_gpu_offload()``);
* ONNX Runtime (embeddings, text to speech): the CUDA execution provider on that GPU
  (``device_id``) when ``onnxruntime.get_available_providers()`` offers it (the
  ``onnxruntime-gpu`` wheel), with the CPU provider after it as ONNX Runtime's own
  fallback for operators CUDA lacks.

Otherwise it runs on the CPU, and :class:`Placement` says why in its ``accelerator``
(``"cpu (fallback: llama-cpp-python built without CUDA)"``) and how to fix it in
``fix``: ``accelmux check`` warns with both, ``/admin/status`` shows the accelerator per
service. A service on a host or virtual device always runs on the CPU
(``n_gpu_layers: 0``, the CPU provider): nothing changes for it.

Speech recognition (pocketsphinx) and detection (OpenCV's cascades) have no GPU path:
on an nvidia device they say so in the same way.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from dataclasses import dataclass
from typing import Any

#: Component types and the runtime that runs them.
RUNTIMES: dict[str, str] = {
    "llama": "llama.cpp",
    "minilm": "onnxruntime",
    "piper": "onnxruntime",
    "pocketsphinx": "pocketsphinx",
    "opencv": "opencv",
}
LLAMA_FIX = (
    "install llama-cpp-python built with CUDA "
    '(CMAKE_ARGS="-DGGML_CUDA=on" pip install --no-binary llama-cpp-python '
    "llama-cpp-python; see docs/gpu.md)"
)
ORT_FIX = "install onnxruntime-gpu in place of onnxruntime (see docs/gpu.md)"


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where one model runs: ``accelerator`` names it for people (``cuda:0``, ``cpu``,
    ``cpu (fallback: WHY)``); ``fix`` says how to get the GPU (empty when nothing is
    missing)."""

    accelerator: str
    gpu_index: int | None = None
    n_gpu_layers: int = 0
    providers: tuple[Any, ...] = ("CPUExecutionProvider",)
    fix: str = ""

    @property
    def on_gpu(self) -> bool:
        return self.gpu_index is not None

    @property
    def fallback(self) -> bool:
        """It should run on a GPU and will run on the CPU."""
        return self.accelerator.startswith("cpu (fallback")


def _cpu_fallback(why: str, fix: str) -> Placement:
    return Placement(accelerator=f"cpu (fallback: {why})", fix=fix)


def llama_gpu_support() -> str | None:
    """None when the installed llama-cpp-python can offload layers to a GPU, else why not."""
    try:
        llama_cpp = importlib.import_module("llama_cpp")
    except ImportError:
        return "llama-cpp-python is not installed"
    supports = getattr(llama_cpp, "llama_supports_gpu_offload", None)
    if supports is None:
        return "this llama-cpp-python cannot say whether it offloads to a GPU"
    try:
        return None if bool(supports()) else "llama-cpp-python built without CUDA"
    except Exception as exc:  # a broken shared library raises its own types
        return f"llama-cpp-python failed to report GPU support ({exc})"


def ort_cuda_support() -> str | None:
    """None when ONNX Runtime offers its CUDA execution provider, else why not."""
    try:
        ort = importlib.import_module("onnxruntime")
    except ImportError:
        return "onnxruntime is not installed"
    try:
        providers = list(ort.get_available_providers())
    except Exception as exc:  # pragma: no cover - a broken install only
        return f"onnxruntime failed to list its providers ({exc})"
    if "CUDAExecutionProvider" in providers:
        return None
    return "onnxruntime without the CUDA provider"


def n_gpu_layers_option(options: dict[str, Any]) -> int | None:
    """The service's own ``n_gpu_layers`` option (None: not set); a bad value is a
    ValueError naming it."""
    value = options.get("n_gpu_layers")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"n_gpu_layers must be an integer (-1: all layers), got {value!r}")
    try:
        layers = int(value)
    except ValueError:
        raise ValueError(
            f"n_gpu_layers must be an integer (-1: all layers), got {value!r}"
        ) from None
    if layers < -1:
        raise ValueError(f"n_gpu_layers must be -1 (all layers) or more, got {layers}")
    return layers


def placement(ctype: str, options: dict[str, Any], gpu_index: int | None) -> Placement:
    """Where a component of type ``ctype`` runs for a service on GPU ``gpu_index``
    (None: a host or virtual device, always the CPU). A bad ``n_gpu_layers`` option is a
    ValueError naming it."""
    layers = n_gpu_layers_option(options)
    if gpu_index is None:
        return Placement(accelerator="cpu")
    runtime = RUNTIMES.get(ctype, ctype)
    if runtime == "llama.cpp":
        if layers == 0:
            return Placement(accelerator="cpu (n_gpu_layers: 0)")
        why = llama_gpu_support()
        if why is not None:
            return _cpu_fallback(why, LLAMA_FIX)
        return Placement(
            accelerator=f"cuda:{gpu_index}",
            gpu_index=gpu_index,
            n_gpu_layers=-1 if layers is None else layers,
        )
    if runtime == "onnxruntime":
        why = ort_cuda_support()
        if why is not None:
            return _cpu_fallback(why, ORT_FIX)
        return Placement(
            accelerator=f"cuda:{gpu_index}",
            gpu_index=gpu_index,
            providers=(
                ("CUDAExecutionProvider", {"device_id": gpu_index}),
                "CPUExecutionProvider",
            ),
        )
    return _cpu_fallback(f"{runtime} has no GPU path here", "none needed: it is small on the CPU")


def own_gpu_bytes(gpu_index: int) -> int | None:
    """What NVML says this process holds on GPU ``gpu_index`` (None: no NVML there).

    The worker measures an ONNX Runtime session's GPU memory as the difference around
    its load: ONNX Runtime reports no figure of its own for its CUDA arena."""
    try:
        nv = importlib.import_module("pynvml")
        nv.nvmlInit()
    except Exception:
        return None
    try:
        handle = nv.nvmlDeviceGetHandleByIndex(gpu_index)
        used = 0
        for getter in (
            nv.nvmlDeviceGetComputeRunningProcesses,
            nv.nvmlDeviceGetGraphicsRunningProcesses,
        ):
            for proc in getter(handle):
                if int(proc.pid) == os.getpid() and proc.usedGpuMemory is not None:
                    used += int(proc.usedGpuMemory)
        return used
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            nv.nvmlShutdown()
