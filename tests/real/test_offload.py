"""Where the real runtimes installed here run a model (this machine's builds are CPU
ones): a host device is the CPU with no layer offloaded, exactly as before; an nvidia
device falls back to the CPU and names why."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from accelmux.config.load import load_config_data
from accelmux.config.offload import offload_warnings
from accelmux.models import LlamaTextModel, MiniLmEmbedder
from accelmux.models.offload import llama_gpu_support, ort_cuda_support, placement

from .support import GEMMA3, LLAMA, ORT, SMOLLM2, need

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


def test_the_gpu_check_config_is_valid_and_check_names_each_fallback(tmp_path: Path) -> None:
    need(LLAMA, SMOLLM2, GEMMA3, ORT)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import gpu_check

    data = gpu_check.gpu_config(tmp_path, "/usr/bin/llama-server")
    cfg = load_config_data(data, "gpu-check", tmp_path)
    assert cfg.services["big"].device == "gpu" and cfg.devices["gpu"].kind == "nvidia"
    warned = {line.split("'")[1] for line in offload_warnings(cfg)}
    if llama_gpu_support() is not None and ort_cuda_support() is not None:  # this machine
        assert warned == set(gpu_check.GPU_SERVICES)
