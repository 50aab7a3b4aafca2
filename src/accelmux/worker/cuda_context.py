"""Open the worker's CUDA context on a GPU, and the runtimes' process-wide state, before
any model: what this costs is the worker's fixed overhead on that GPU
(:mod:`accelmux.worker.gpu_account`), whichever model loads first.

* the CUDA primary context, the one the CUDA runtime (and so llama.cpp and ONNX Runtime)
  uses: retained through the driver API (``libcuda.so.1``: ``cuInit``,
  ``cuDevicePrimaryCtxRetain``), kept for the worker's life;
* llama.cpp, when it was built with GPU support: its backends registered
  (``llama_backend_init``: the CUDA backend finds its devices);
* ONNX Runtime, when it offers the CUDA execution provider: one tiny session (an 8x8
  MatMul, encoded here so that no ``onnx`` package is needed) created and run once on
  that GPU, which loads the provider's libraries into the context; the session is dropped.

What a model's own context or session allocates afterwards (llama.cpp's per-context
cuBLAS workspace and memory pool, a session's arena) is that model's. Kernel images the
CUDA runtime loads lazily at their first use are charged, as growth, to the service
whose request first needed them (docs/gpu.md says so). Without a driver nothing is
opened and nothing fails.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
from typing import Any

from accelmux.models.offload import llama_gpu_support, ort_cuda_support

#: The primary contexts this process retained (GPU index -> handle), kept for its life.
_RETAINED: dict[int, ctypes.c_void_p] = {}


def open_gpu(gpu_index: int) -> list[str]:
    """Open GPU ``gpu_index`` for this process; returns what was opened."""
    opened = []
    if _retain_primary_context(gpu_index):
        opened.append("cuda context")
    if llama_gpu_support() is None and _init_llama_backend():
        opened.append("llama.cpp backends")
    if ort_cuda_support() is None and _run_tiny_onnx_session(gpu_index):
        opened.append("onnxruntime CUDA provider")
    return opened


def _retain_primary_context(gpu_index: int) -> bool:
    if gpu_index in _RETAINED:
        return True
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    device = ctypes.c_int()
    context = ctypes.c_void_p()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(device), gpu_index) != 0:
        return False
    if cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) != 0:
        return False
    _RETAINED[gpu_index] = context
    return True


def _init_llama_backend() -> bool:
    try:
        llama_cpp = importlib.import_module("llama_cpp")
        llama_cpp.llama_backend_init()
    except Exception:  # a broken shared library raises its own types
        return False
    return True


def _run_tiny_onnx_session(gpu_index: int) -> bool:
    try:
        ort = importlib.import_module("onnxruntime")
        numpy = importlib.import_module("numpy")
        providers: list[Any] = [("CUDAExecutionProvider", {"device_id": gpu_index})]
        session = ort.InferenceSession(tiny_matmul_model(), providers=providers)
        session.run(None, {"x": numpy.ones((8, 8), dtype=numpy.float32)})
    except Exception:
        return False
    with contextlib.suppress(Exception):
        del session
    return True


# -- a tiny ONNX model, in protobuf's wire format ---------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _int(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


def _msg(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _str(field: int, text: str) -> bytes:
    return _msg(field, text.encode())


def _float_matrix(name: str, rows: int, cols: int) -> bytes:
    """A ValueInfoProto: ``name``, a float tensor of shape (rows, cols)."""
    shape = _msg(1, _int(1, rows)) + _msg(1, _int(1, cols))
    tensor = _int(1, 1) + _msg(2, shape)  # elem_type 1: FLOAT
    return _str(1, name) + _msg(2, _msg(1, tensor))


def tiny_matmul_model() -> bytes:
    """An ONNX model (IR 8, opset 13): ``y = MatMul(x, x)`` for an 8x8 float ``x``."""
    node = _str(1, "x") + _str(1, "x") + _str(2, "y") + _str(3, "mm") + _str(4, "MatMul")
    graph = (
        _msg(1, node)
        + _str(2, "warmup")
        + _msg(11, _float_matrix("x", 8, 8))
        + _msg(12, _float_matrix("y", 8, 8))
    )
    opset = _str(1, "") + _int(2, 13)
    return _int(1, 8) + _str(2, "accelmux") + _msg(7, graph) + _msg(8, opset)
