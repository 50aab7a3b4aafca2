"""A load that runs out of memory teaches the Manager at once (one OOM per service)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from accelmux.core.events import LoadFailed, Tick
from accelmux.core.specs import MemoryProfile
from accelmux.core.types import GIB, MIB
from accelmux.errors import BackendCrashedError, BackendError, is_out_of_memory

from .support import EXACT, arrive, loads, manager, service


def _load_after_failure(*, out_of_memory: bool, weights: int = 2 * GIB) -> tuple[int, int]:
    """(weights granted at the first load, at the load after it failed)."""
    m = manager(service("img", profile=MemoryProfile(weights=weights, workspace=64 * MIB)))
    (first,) = loads(m.handle(arrive("i1", "img"), 0.0))
    m.handle(LoadFailed(service="img", error="boom", out_of_memory=out_of_memory), 0.1)
    out = m.handle(arrive("i2", "img"), 60.0) + m.handle(Tick(), 61.0)
    (second,) = loads(out)
    return first.weights_bytes, second.weights_bytes


def test_a_load_out_of_memory_is_projected_twice_as_large_next_time() -> None:
    first, second = _load_after_failure(out_of_memory=True)
    assert second >= 2 * first
    # Any other failure (a bad model path) says nothing about size.
    assert _load_after_failure(out_of_memory=False) == (first, first)


def test_requests_of_a_never_measured_service_are_raised_with_its_load() -> None:
    m = manager(
        service("img", profile=MemoryProfile(weights=GIB, workspace=100 * MIB)), knobs=EXACT
    )
    m.handle(arrive("i1", "img"), 0.0)
    before = m.world.services["img"].calibration.active.factor
    m.handle(LoadFailed(service="img", error="cudaMalloc failed", out_of_memory=True), 0.1)
    assert m.world.services["img"].calibration.active.factor >= 2 * before


@given(weights=st.integers(64, 8 * 1024).map(lambda n: n * MIB))
def test_calibration_after_a_load_oom_at_least_doubles_the_grant(weights: int) -> None:
    first, second = _load_after_failure(out_of_memory=True, weights=min(weights, 5 * GIB))
    assert second >= 2 * first


def test_out_of_memory_is_recognised_in_what_runtimes_say() -> None:
    for text in (
        "CUDA out of memory. Tried to allocate 2.00 GiB",
        "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 4096 MiB failed: cudaMalloc",
        "llama_model_load: failed to allocate buffer",
        "std::bad_alloc",
        "chat: exited with code -9 while starting",
        "onnxruntime: Failed to allocate memory",
    ):
        assert is_out_of_memory(BackendCrashedError(text)), text
    assert is_out_of_memory(MemoryError())
    for text in ("no such file: /models/x.gguf", "exited with code 1 while starting", "BOOM"):
        assert not is_out_of_memory(BackendError(text)), text
