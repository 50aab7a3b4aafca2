"""What the inference worker holds on each GPU, and whose it is, in any load order.

* **Overhead** (fixed, the worker's): before the first model on a GPU, the worker opens
  its CUDA context there and the runtimes' process-wide state
  (:func:`accelmux.worker.cuda_context.open_gpu`), then reads what NVML says the process
  holds on that GPU: that is its overhead on the GPU, measured once. Every model loaded
  afterwards, first or not, measures only itself.
* **Each component's own figure**: llama.cpp's buffers (its log,
  :mod:`accelmux.models.llama_buffers`); an ONNX Runtime session's load delta (ONNX
  Runtime's Python API has no allocator statistics: the C API's ``AllocatorGetStats``
  has no binding), taken after the overhead is open, so it is the session's alone.
* **Growth after load**: a runtime's allocator keeps what a request made it grow (ONNX
  Runtime's arena never shrinks by default; llama.cpp's CUDA memory pool neither). When
  the last request running on a GPU ends, the worker reads NVML for its process again:
  what it holds beyond the overhead and the components' own figures is claimed by the
  components that served requests since the GPU was last idle (split evenly among them;
  one alone, the usual case, gets it all). When NVML shows less than that (an allocator
  gave memory back), the claimed growth shrinks, theirs first, never below zero.

So each service's GPU bytes are its runtime's figure plus the growth its requests left,
and the overhead is the same whichever model loads first. The daemon's NVIDIA monitor
reconciles these claims with NVML per process (:func:`accelmux.monitors.nvidia.reconcile_worker`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Protocol

#: Reads what NVML says this process holds on a GPU (None: no NVML there).
ReadGpu = Callable[[int], "int | None"]
#: Opens this process's CUDA context and the runtimes' process-wide state on a GPU;
#: returns what it opened (for the report).
OpenGpu = Callable[[int], "list[str]"]


class GpuHolder(Protocol):
    """A loaded model as the account sees it."""

    gpu_growth: int

    def gpu_index_now(self) -> int | None: ...

    def runtime_gpu_bytes(self) -> int: ...


class GpuAccount:
    """The worker's GPU overhead per GPU and the growth its components' requests left."""

    def __init__(self, read: ReadGpu, open_gpu: OpenGpu) -> None:
        self._read = read
        self._open_gpu = open_gpu
        self._lock = threading.Lock()
        #: GPU -> bytes the process held there once its context was open, before models
        self.overhead: dict[int, int] = {}
        #: GPU -> what opening it did
        self.opened: dict[int, list[str]] = {}
        self._running: dict[int, int] = {}  # GPU -> requests running there
        self._served: dict[int, list[GpuHolder]] = {}  # GPU -> who ran since it was idle

    def open(self, gpu: int) -> None:
        """Before the first model on ``gpu``: open it and measure the fixed overhead."""
        with self._lock:
            if gpu in self.overhead:
                return
            opened = self._open_gpu(gpu)
            self.opened[gpu] = opened
            self.overhead[gpu] = max(0, self._read(gpu) or 0)

    def begin(self, holder: GpuHolder) -> None:
        """A request of ``holder`` starts."""
        gpu = holder.gpu_index_now()
        if gpu is None:
            return
        with self._lock:
            self._running[gpu] = self._running.get(gpu, 0) + 1
            served = self._served.setdefault(gpu, [])
            if all(h is not holder for h in served):
                served.append(holder)

    def end(self, holder: GpuHolder, everyone: Callable[[], Iterable[GpuHolder]]) -> None:
        """A request of ``holder`` ended; when it was the last running on its GPU, what
        NVML shows beyond the overhead and the components' own figures is claimed (or
        given back) by those that served requests since the GPU was idle. ``everyone``:
        the loaded components."""
        gpu = holder.gpu_index_now()
        if gpu is None:
            return
        with self._lock:
            left = max(0, self._running.get(gpu, 0) - 1)
            self._running[gpu] = left
            if left:
                return
            served, self._served[gpu] = self._served.get(gpu, []), []
            measured = self._read(gpu)
            if measured is None or gpu not in self.overhead:
                return
            on_gpu = [h for h in everyone() if h.gpu_index_now() == gpu]
            held = sum(h.runtime_gpu_bytes() + h.gpu_growth for h in on_gpu)
            explained = self.overhead[gpu] + held
            settle(measured - explained, [h for h in served if h in on_gpu], on_gpu)

    def report(self) -> dict[str, int]:
        """The fixed overhead per GPU (keys are GPU indexes as strings, for JSON)."""
        with self._lock:
            return {str(gpu): n for gpu, n in sorted(self.overhead.items())}


def settle(delta: int, served: list[GpuHolder], on_gpu: list[GpuHolder]) -> None:
    """Charge ``delta`` bytes of unexplained growth (negative: memory given back) to the
    holders: growth split evenly among ``served`` (the remainder to the first ones); a
    give-back taken from ``served`` first, then from the others on the GPU, each down to
    zero at most."""
    if delta > 0 and served:
        share, rest = divmod(delta, len(served))
        for i, holder in enumerate(served):
            holder.gpu_growth += share + (1 if i < rest else 0)
        return
    owed = -delta
    for holder in [*served, *(h for h in on_gpu if h not in served)]:
        if owed <= 0:
            break
        taken = min(owed, holder.gpu_growth)
        holder.gpu_growth -= taken
        owed -= taken
