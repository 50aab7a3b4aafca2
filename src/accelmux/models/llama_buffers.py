"""llama.cpp's own account of the buffers it allocates, read from its log.

When it loads a model and creates a context, llama.cpp logs every buffer it allocates,
named by its buffer type (the device: ``CUDA0``, ``CPU``, ``CPU_Mapped`` for weights
mapped from the file, ``CUDA_Host`` for pinned host memory) with its size::

    load_tensors:        CUDA0 model buffer size =   123.45 MiB
    llama_kv_cache:      CUDA0 KV buffer size =    48.00 MiB
    sched_reserve:       CUDA0 compute buffer size =    66.50 MiB
    llama_context:   CUDA_Host  output buffer size =     0.19 MiB

A new context on the same weights (a resize) logs its KV, compute and output buffers
again. These lines are the runtime's own figures: llama-cpp-python offers no other way
to read them (llama.cpp's ``llama_get_memory_breakdown`` is a C++ function, out of
ctypes' reach). :func:`capture` routes llama.cpp's log to the calling thread for the
length of a load or a resize (other threads' lines still go where llama-cpp-python sends
them), and :func:`parse_buffers` reads the sizes (two decimals of MiB: within 10 KiB).
"""

from __future__ import annotations

import ctypes
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: One buffer line: the buffer type's name, what the buffer holds, its size in MiB.
BUFFER_LINE = re.compile(r"(\S+)\s+(model|KV|compute|output) buffer size\s*=\s*([0-9.]+)\s*MiB")
#: What a context (not the weights) allocates: replaced at each new context.
CONTEXT_KINDS = frozenset({"KV", "compute", "output"})
MIB = 1 << 20

#: (buffer type, what it holds) -> bytes.
Buffers = dict[tuple[str, str], int]

_local = threading.local()
_install_lock = threading.Lock()
#: the ctypes callback llama.cpp calls, kept alive here once installed
_callbacks: list[Any] = []


def parse_buffers(text: str) -> Buffers:
    """The buffer sizes llama.cpp logged in ``text`` (sizes of one name and kind added)."""
    out: Buffers = {}
    for name, kind, mib in BUFFER_LINE.findall(text):
        key = (name, kind)
        out[key] = out.get(key, 0) + round(float(mib) * MIB)
    return out


def on_gpu(buffers: Buffers, gpu_index: int) -> int:
    """Bytes of ``buffers`` on CUDA device ``gpu_index`` (pinned host memory is not)."""
    name = f"CUDA{gpu_index}"
    return sum(n for (buffer, _), n in buffers.items() if buffer == name)


def with_new_context(buffers: Buffers, context: Buffers) -> Buffers:
    """The weights' buffers of ``buffers`` and a new context's ``context`` buffers."""
    kept = {k: n for k, n in buffers.items() if k[1] not in CONTEXT_KINDS}
    return {**kept, **{k: n for k, n in context.items() if k[1] in CONTEXT_KINDS}}


def _install(llama_cpp: Any) -> None:
    """Route llama.cpp's log through one callback: to the capturing thread's list while
    it captures, else to llama-cpp-python's own callback (unchanged behaviour)."""
    with _install_lock:
        if _callbacks:
            return
        logger = getattr(llama_cpp, "_logger", None)
        forward = getattr(logger, "llama_log_callback", None)

        def on_log(level: int, text: bytes, user_data: Any) -> None:
            lines = getattr(_local, "lines", None)
            if lines is not None:
                lines.append(text.decode("utf-8", "replace"))
            elif forward is not None:
                forward(level, text, user_data)

        _callbacks.append(llama_cpp.llama_log_callback(on_log))
        llama_cpp.llama_log_set(_callbacks[0], ctypes.c_void_p(0))


@contextmanager
def capture(llama_cpp: Any) -> Iterator[list[str]]:
    """Collect what llama.cpp logs on this thread meanwhile (the list fills as it runs).
    A llama-cpp-python without ``llama_log_set`` yields an empty list."""
    if not hasattr(llama_cpp, "llama_log_set") or not hasattr(llama_cpp, "llama_log_callback"):
        yield []
        return
    _install(llama_cpp)
    lines: list[str] = []
    _local.lines = lines
    try:
        yield lines
    finally:
        _local.lines = None
