"""The one exception root of accelmux.

Hierarchy::

    AccelmuxError
    ├── ConfigError            a config or scenario file is invalid (carries every problem)
    ├── InvariantError         a core invariant broke: a bug, never a normal outcome
    ├── BackendError           a backend failed to load, serve or stop
    │   ├── BackendCrashedError    the backend process died or its model raised
    │   └── BackendTimeoutError    a load or request took longer than its limit
    ├── RequestError           a client request is invalid (bad field, too large)
    └── ClusterError           cluster mode cannot start: no Ray, no cluster, no such node

"Does not fit" is never an exception: the core returns it as a decision (a Reject or
an Enqueue action with a reason). Only broken invariants raise.
"""

from __future__ import annotations

import re

#: What runtimes say when an allocation fails: CUDA and its libraries, llama.cpp/ggml,
#: PyTorch, ONNX Runtime, the C++ and Python runtimes, and a child the kernel's OOM
#: killer ended (SIGKILL, code -9) while it started inside its memory limit.
_OUT_OF_MEMORY = re.compile(
    r"out of memory|\bOOM\b|cudaMalloc|CUDA_ERROR_OUT_OF_MEMORY|failed to allocate"
    r"|unable to allocate|cannot allocate memory|std::bad_alloc|MemoryError|ENOMEM"
    r"|exited with code -9 while starting",
    re.IGNORECASE,
)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether a backend's failure says it ran out of memory."""
    return isinstance(exc, MemoryError) or bool(_OUT_OF_MEMORY.search(str(exc)))


class AccelmuxError(Exception):
    """Root of every error accelmux raises on purpose."""


class ConfigError(AccelmuxError):
    """A config or scenario file failed validation; ``problems`` lists every one."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = list(problems)
        joined = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{source}: {len(self.problems)} problem(s)\n{joined}")

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, list[str]]]:
        # rebuilt from its own arguments (another process raised it: a pool worker)
        return (type(self), (self.source, self.problems))


class InvariantError(AccelmuxError):
    """A core invariant broke (for example committed memory above the budget)."""


class BackendError(AccelmuxError):
    """A backend failed to load, serve or stop."""


class BackendCrashedError(BackendError):
    """The backend process died or its model raised while serving."""


class BackendTimeoutError(BackendError):
    """A backend load or request exceeded its time limit."""


class RequestError(AccelmuxError):
    """A client request is invalid; ``field`` names the offending field."""

    def __init__(self, message: str, *, field: str | None = None, status: int = 400) -> None:
        self.field = field
        self.status = status
        super().__init__(message)


class ClusterError(AccelmuxError):
    """Cluster mode cannot start: Ray is not installed, its cluster cannot be reached, or
    a node name is unknown."""
