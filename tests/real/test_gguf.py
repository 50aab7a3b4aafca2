"""GGUF header profiles and the llama.cpp memory estimate against measured RSS."""

from __future__ import annotations

import pytest

from accelmux.errors import BackendError
from accelmux.models import gguf_profile, llama_memory_estimate
from accelmux.models.assets import gemma3_gguf_path, smollm2_gguf_path

from . import measure_memory
from .support import GEMMA3, GGUF, LLAMA, SMOLLM2, need

pytestmark = pytest.mark.real

MiB = 2**20
#: Measured RSS (after load and a first request) must be within this fraction of the
#: estimate of resident bytes (weights + KV + output + runtime tables).
RESIDENT_TOLERANCE = 0.15


def test_profile_matches_the_gguf_package() -> None:
    need(SMOLLM2, GGUF)
    import gguf

    path = smollm2_gguf_path()
    profile = gguf_profile(path)
    reader = gguf.GGUFReader(str(path))
    assert profile.weights_bytes == sum(int(t.n_bytes) for t in reader.tensors)
    assert profile.n_tensors == len(reader.tensors)
    field = reader.fields
    assert profile.n_layers == field["llama.block_count"].contents() == 30
    assert profile.n_kv_heads == field["llama.attention.head_count_kv"].contents() == 3
    assert profile.n_heads == 9
    assert profile.head_dim == 576 // 9 == 64
    assert profile.context_length == 8192
    assert profile.n_vocab == 49152
    assert profile.has_chat_template
    assert profile.license == "apache-2.0"
    # 2 (K and V) x layers x KV heads x head_dim x 2 bytes (f16)
    assert profile.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2 == 23040


def test_profile_of_gemma3() -> None:
    need(GEMMA3)
    profile = gguf_profile(gemma3_gguf_path())
    assert profile.architecture == "gemma3"
    assert (profile.n_layers, profile.n_kv_heads, profile.head_dim) == (18, 1, 256)
    assert profile.kv_bytes_per_token == 2 * 18 * 1 * 256 * 2
    assert profile.n_vocab == 262144
    assert profile.sliding_window == 512
    assert not profile.has_chat_template
    assert profile.weights_bytes == 246_587_904  # the sum of its tensors (gguf.GGUFReader)
    assert profile.weights_bytes < profile.file_bytes


def test_estimate_pads_the_context_like_llama_cpp() -> None:
    need(SMOLLM2)
    profile = gguf_profile(smollm2_gguf_path())
    assert profile.kv_bytes(1000) == profile.kv_bytes(1024) == 1024 * 23040
    small = llama_memory_estimate(profile, 512)
    big = llama_memory_estimate(profile, 8192)
    assert big.kv_bytes - small.kv_bytes == (8192 - 512) * 23040
    assert big.weights_bytes == small.weights_bytes == profile.weights_bytes
    assert big.total_bytes > big.resident_bytes > big.kv_bytes


def test_not_a_gguf_file_is_a_backend_error(tmp_path: object) -> None:
    from pathlib import Path

    bad = Path(str(tmp_path)) / "x.gguf"
    bad.write_bytes(b"GGML" + b"\0" * 64)
    with pytest.raises(BackendError, match="bad magic"):
        gguf_profile(bad)


@pytest.mark.parametrize(
    ("name", "n_ctx", "needs"),
    [("smollm2", 4096, SMOLLM2), ("gemma3", 2048, GEMMA3)],
)
def test_estimate_matches_measured_rss(name: str, n_ctx: int, needs: tuple[str, str]) -> None:
    need(LLAMA, needs)
    m = measure_memory.measure(name, n_ctx)
    resident = m["resident_estimate"]
    assert abs(m["steady"] - resident) <= RESIDENT_TOLERANCE * resident, m
    # the full estimate also counts the compute buffer, reserved but barely touched on a CPU
    assert m["peak"] <= m["estimate"], m
