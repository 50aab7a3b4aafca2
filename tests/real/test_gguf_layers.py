"""The packaged SmolLM2's weights per layer (the gguf package), and how many layers fit
in a given amount of GPU memory: the measure a partial offload would be chosen by."""

from __future__ import annotations

import pytest

from accelmux.models.assets import smollm2_gguf_path
from accelmux.models.gguf_layers import GgufLayers, gguf_layers, layers_that_fit
from accelmux.models.gguf_profile import gguf_profile

from .support import SMOLLM2, need

pytestmark = pytest.mark.real


def test_per_layer_sizes_add_up_to_the_weights_and_choose_a_layer_count() -> None:
    need(SMOLLM2)
    path = smollm2_gguf_path()
    layers = gguf_layers(path)
    profile = gguf_profile(path)
    assert len(layers.blocks) == profile.n_layers and all(b > 0 for b in layers.blocks)
    assert layers.total_bytes == profile.weights_bytes
    kv = profile.kv_bytes_per_token * 2048 // profile.n_layers  # per layer at 2048 tokens
    everything = sum(layers.blocks) + len(layers.blocks) * kv + layers.output_bytes
    full = profile.n_layers + 1  # llama.cpp counts the output layer too
    assert layers_that_fit(layers, everything, kv_bytes_per_layer=kv) == full
    half = everything // 2
    some = layers_that_fit(layers, half, kv_bytes_per_layer=kv)
    assert 1 < some < full
    assert layers_that_fit(layers, layers.output_bytes - 1, kv_bytes_per_layer=kv) == 0
    with_fixed = layers_that_fit(layers, everything, kv_bytes_per_layer=kv, fixed_bytes=half)
    assert some <= with_fixed < full


def test_blocks_go_to_the_gpu_from_the_last_one_down() -> None:
    layers = GgufLayers(blocks=(10, 10, 30), output_bytes=5, other_bytes=100)
    assert layers_that_fit(layers, 5 + 29, kv_bytes_per_layer=0) == 1  # the output alone
    assert layers_that_fit(layers, 5 + 30 + 2, kv_bytes_per_layer=2) == 2  # and the last block
    assert layers_that_fit(layers, 5 + 30 + 10 + 4, kv_bytes_per_layer=2) == 3
    assert layers_that_fit(layers, 5 + 50 + 6, kv_bytes_per_layer=2) == 4  # everything
    assert layers_that_fit(layers, 10**6, kv_bytes_per_layer=2, fixed_bytes=10**6) == 0
