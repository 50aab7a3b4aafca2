"""Where the real runtimes installed here run a model (this machine's builds are CPU
ones): a host device is the CPU with no layer offloaded, exactly as before; an nvidia
device falls back to the CPU and names why."""

from __future__ import annotations

import pytest

from accelmux.models import LlamaTextModel, MiniLmEmbedder
from accelmux.models.offload import llama_gpu_support, ort_cuda_support, placement

from .support import LLAMA, ORT, need

pytestmark = pytest.mark.real


def test_llama_on_a_host_device_offloads_nothing(smollm2: LlamaTextModel) -> None:
    need(LLAMA)
    assert placement("llama", {}, None).n_gpu_layers == 0
    assert smollm2.n_gpu_layers == 0 and smollm2._gpu_kwargs() == {"n_gpu_layers": 0}
    assert smollm2.complete("The capital of France is", max_tokens=4, temperature=0).text


def test_the_installed_llama_build_is_detected() -> None:
    need(LLAMA)
    why = llama_gpu_support()
    where = placement("llama", {}, 0)
    if why is None:  # a CUDA build
        assert where.accelerator == "cuda:0" and where.n_gpu_layers == -1
    else:
        assert where.accelerator == f"cpu (fallback: {why})" and where.n_gpu_layers == 0


def test_onnx_runs_on_the_providers_it_was_given(embedder: MiniLmEmbedder) -> None:
    need(ORT)
    assert embedder.running_providers() == ["CPUExecutionProvider"]
    if ort_cuda_support() is not None:
        assert placement("minilm", {}, 0).fallback
