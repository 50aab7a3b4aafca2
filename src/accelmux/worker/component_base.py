"""What every model a worker hosts is: a :class:`Component`, and a service's hold on it.

A :class:`Component` is one loaded model (one copy of a model file). Services name a
component by its key (:func:`accelmux.worker.components.component_key`); two services
with the same key share one loaded copy (the worker refcounts it). Every model call of a
component runs on that component's own thread, so a component never sees two calls at
once.

Memory per component, reported to the daemon:

* LLMs (llama.cpp): ``weights`` = the GGUF tensor bytes, ``kv`` = ``n_ctx x`` KV bytes
  per token (both what the runtime allocates), ``runtime`` = the rest of the RSS the
  load added (measured);
* the others: ``runtime`` = RSS the runtime's first import added (libraries: zero when
  another component already imported them), ``weights`` = RSS the load added.

On a GPU (:mod:`accelmux.models.offload`): ``gpu`` = the bytes the component holds on
its GPU by its runtime's own account (llama.cpp: the buffers it logged for the weights,
KV cache, compute and output on that GPU; ONNX Runtime: what NVML saw this process gain
over the load, after the worker opened the GPU) plus the growth its requests left there
(``gpu_growth``). :mod:`accelmux.worker.gpu_account` opens the GPU before the first model
(the worker's overhead) and settles the growth; the daemon's NVIDIA monitor reconciles
the figures with NVML's total for the worker process.
"""

from __future__ import annotations

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

from accelmux.core.types import ServiceKind
from accelmux.errors import BackendError, RequestError
from accelmux.models.llama_sequences import SequenceReport, TextStream
from accelmux.models.offload import Placement, own_gpu_bytes, placement
from accelmux.worker.gpu_account import GpuAccount

#: Modules each kind of component imports (their first import is the "runtime" cost).
RUNTIME_MODULES: dict[str, tuple[str, ...]] = {
    "llama": ("numpy", "llama_cpp"),
    "minilm": ("numpy", "onnxruntime", "tokenizers"),
    "piper": ("numpy", "onnxruntime", "piper"),
    "pocketsphinx": ("numpy", "pocketsphinx"),
    "opencv": ("numpy", "cv2"),
}


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


@dataclass
class StreamControl:
    """What the worker and a component's stream share: the cancel flag, the KV bytes the
    stream holds so far (its peak), and the generation behind it when that generation
    can pause and park (a llama.cpp :class:`TextStream`; None: it pauses only between
    the chunks the component yields, holding nothing)."""

    cancelled: threading.Event = field(default_factory=threading.Event)
    kv: int = 0
    sequence: TextStream | None = None

    def pause(self, *, park: bool) -> SequenceReport:
        if self.sequence is None:
            return SequenceReport("paused")
        return self.sequence.pause(park=park)

    def resume(self) -> SequenceReport:
        if self.sequence is None:
            return SequenceReport("running")
        return self.sequence.resume()

    @property
    def parked_bytes(self) -> int:
        return self.sequence.parked_bytes if self.sequence is not None else 0


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
        #: the GPU its service's device is (None: a host or virtual device: the CPU)
        self.gpu_index: int | None = None
        self.placement = Placement(accelerator="cpu")
        #: bytes its load added on its GPU, as NVML saw this process (0 on the CPU)
        self.gpu_bytes = 0
        #: what its requests left on its GPU since the load (allocator growth)
        self.gpu_growth = 0
        #: the worker's GPU account: opens a GPU before the first model there
        self.gpu_account: GpuAccount | None = None

    # -- lifecycle ----------------------------------------------------------------------
    def load(self, slot: Slot) -> None:
        try:
            self.placement = placement(self.ctype, self.options, self.gpu_index)
        except ValueError as exc:
            raise BackendError(f"{self.key}: {exc}") from None
        gpu = self.placement.gpu_index
        self.gpu_growth = 0
        if gpu is not None and self.gpu_account is not None:
            self.gpu_account.open(gpu)  # the worker's overhead, not this model's
        gpu_before = own_gpu_bytes(gpu) if gpu is not None else None
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
        if gpu is not None and gpu_before is not None:
            gpu_after = own_gpu_bytes(gpu)
            self.gpu_bytes = max(0, (gpu_after or 0) - gpu_before)

    @property
    def accelerator(self) -> str:
        return self.placement.accelerator

    def gpu_index_now(self) -> int | None:
        """The GPU it runs on (None: the CPU)."""
        return self.placement.gpu_index

    def runtime_gpu_bytes(self) -> int:
        """What its runtime says it holds on its GPU (the load's figure here; llama.cpp
        reads its buffers)."""
        return self.gpu_bytes if self.placement.on_gpu else 0

    def gpu_bytes_now(self) -> int:
        """What it holds on its GPU now: its runtime's figure and its requests' growth."""
        return self.runtime_gpu_bytes() + self.gpu_growth if self.placement.on_gpu else 0

    def live(self) -> dict[str, Any]:
        """Live figures for the status page (an LLM: its context size)."""
        return {}

    def _load(self, slot: Slot) -> None:
        raise NotImplementedError

    def unload(self) -> None:
        raise NotImplementedError

    def kv_bytes(self) -> int:
        return 0

    def weights_file(self) -> Path | None:
        """The file its weights are memory-mapped from (what parking keeps in RAM);
        None: its weights are not a mapped file, and it unloads cold."""
        return None

    def resize(self, slots: list[Slot]) -> bool:
        """Apply the KV pools the slots ask for; False when there is nothing to resize."""
        return False

    def kept_streams(self) -> int:
        """Paused streams it keeps in host memory while unloaded (they continue after
        its next load); a component that keeps some outlives its unload."""
        return 0

    def discard(self, why: str) -> None:
        """End the paused streams it kept while unloaded (``why``: their error)."""

    def release(self, slot: Slot) -> None:
        """A service lets go of this component (per-service state is closed)."""

    # -- requests -----------------------------------------------------------------------
    def infer(
        self, slot: Slot, endpoint: str, body: dict[str, Any], files: dict[str, bytes]
    ) -> tuple[int, str, bytes, int]:
        """(status, content type, body, extra peak bytes beyond the RSS growth)."""
        raise BackendError(f"{self.ctype} serves no endpoint {endpoint}")

    def stream(
        self, slot: Slot, endpoint: str, body: dict[str, Any], control: StreamControl
    ) -> Iterator[bytes]:
        """SSE chunks; the worker pulls them one at a time and may stop between two
        (a pause) and continue later, on this component's thread."""
        raise RequestError(f"{endpoint} cannot stream here", field="stream")


def json_body(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()
