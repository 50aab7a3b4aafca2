"""``memory.gguf``: an LLM's profile read from its GGUF header, before any load."""

from __future__ import annotations

import pytest
from tests.real.support import SMOLLM2, need

from accelmux.config.load import load_config_data
from accelmux.config.specs import to_manager_spec

pytestmark = pytest.mark.real


def test_llm_profile_comes_from_the_gguf_header() -> None:
    need(SMOLLM2)
    from accelmux.models.assets import smollm2_gguf_path

    path = str(smollm2_gguf_path())
    data = {
        "devices": {"d": {"kind": "virtual", "capacity": "4GiB"}},
        "services": {
            "chat": {"kind": "chat", "memory": {"gguf": path}},
            "tuned": {"kind": "chat", "memory": {"gguf": path, "kv_ceiling": "32MiB"}},
        },
    }
    spec = to_manager_spec(load_config_data(data, "test"))
    chat, tuned = spec.services
    # SmolLM2-135M: 2 (K, V) x 30 layers x 3 KV heads x 64 dims x 2 bytes per token
    assert chat.profile.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2
    assert 90 * 2**20 < chat.profile.weights < 95 * 2**20  # the Q4_1 tensor bytes
    assert chat.profile.kv_floor == 512 * 23040 and chat.profile.kv_ceiling == 4096 * 23040
    assert chat.profile.runtime > 20 * 2**20
    assert tuned.profile.kv_ceiling == 32 * 2**20  # what the config sets wins
