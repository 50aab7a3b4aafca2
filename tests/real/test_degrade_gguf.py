"""A partial offload's forms are sized from the GGUF's own per-layer sizes: the output
layer and the last blocks, as llama.cpp offloads them."""

from __future__ import annotations

import pytest

from accelmux.config.load import load_config_data
from accelmux.config.specs import to_manager_spec
from accelmux.models.assets import smollm2_gguf_path
from accelmux.models.gguf_layers import gguf_layers

from .support import SMOLLM2, need

pytestmark = pytest.mark.real


def test_offload_forms_hold_the_bytes_of_their_layers() -> None:
    need(SMOLLM2)
    path = smollm2_gguf_path()
    layers = gguf_layers(path)
    total = len(layers.blocks) + 1
    cfg = load_config_data(
        {
            "devices": {
                "gpu": {"kind": "nvidia", "index": 0, "capacity": "8GiB"},
                "cpu": {"kind": "host", "capacity": "16GiB"},
            },
            "services": {
                "chat": {
                    "kind": "chat",
                    "device": "gpu",
                    "memory": {"gguf": str(path)},
                    "degrade": {
                        "fallback_device": "cpu",
                        "min_gpu_layers": 4,
                        "max_gpu_layers": 20,
                    },
                }
            },
        },
        "test",
    )
    spec = to_manager_spec(cfg)
    forms = {s.name: s for s in spec.services}
    full = forms["chat@gpu"].profile.weights
    whole = sum(layers.blocks) + layers.output_bytes
    for n in (20, 4):
        form = forms[f"chat@gpu:{n}"]
        assert form.variant is not None
        on_gpu = layers.output_bytes + sum(layers.blocks[len(layers.blocks) - (n - 1) :])
        assert form.variant.gpu_share == pytest.approx(on_gpu / whole)
        assert form.profile.weights == round(full * on_gpu / whole)
        assert 1 < n < total
    assert forms["chat@cpu"].profile.weights == full
