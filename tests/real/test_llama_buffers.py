"""llama.cpp's own buffer figures, read from its log at a load and a resize, with the
packaged SmolLM2 (on the CPU here: the same lines name ``CUDA0`` on a GPU)."""

from __future__ import annotations

import pytest

from accelmux.models import LlamaTextModel, llama_adapter
from accelmux.models.llama_buffers import on_gpu

from .support import LLAMA, SMOLLM2, need

pytestmark = pytest.mark.real
KIB = 1024


def test_load_and_resize_read_the_buffers_llama_cpp_allocated() -> None:
    need(LLAMA, SMOLLM2)
    model = LlamaTextModel.smollm2(n_ctx=1024)
    model.load()
    try:
        buffers = model.buffers
        kinds = {kind for _, kind in buffers}
        assert {"model", "KV", "compute", "output"} <= kinds
        llama_cpp = llama_adapter.runtime()
        weights = sum(n for (_, kind), n in buffers.items() if kind == "model")
        size = llama_cpp.llama_model_size(model._llm._model.model)
        assert abs(weights - size) <= 10 * KIB  # the log's two decimals of MiB
        kv = sum(n for (_, kind), n in buffers.items() if kind == "KV")
        assert abs(kv - 1024 * model.profile.kv_bytes_per_token) <= 10 * KIB
        assert on_gpu(buffers, 0) == 0  # all on the CPU: no CUDA0 buffer
        model.resize_context(2048)  # a new context: its buffers replace the old ones
        grown = sum(n for (_, kind), n in model.buffers.items() if kind == "KV")
        assert abs(grown - 2 * kv) <= 20 * KIB
        assert sum(n for (_, k), n in model.buffers.items() if k == "model") == weights
    finally:
        model.unload()
    assert model.buffers == {}
