"""The daemon runs one of the simulator's baselines when ``policy.name`` names it.

The baselines live in ``accelmux.sim.baselines``, outside the product's core; the
daemon's wiring imports them, so a config can name one to compare with accelmux, and
the daemon says in its log and in ``/admin/status`` that it runs a baseline.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from tests.live.support import fake

from accelmux.config.load import load_config_data
from accelmux.core.policies.accelmux import AccelmuxPolicy
from accelmux.errors import ConfigError
from accelmux.runtime.daemon import Runtime
from accelmux.sim.baselines.policies import LlamaSwapPolicy, OllamaContainersPolicy


def config(policy: str) -> dict[str, Any]:
    return {
        "devices": {"gpu": {"kind": "virtual", "capacity": "2GiB", "headroom": "128MiB"}},
        "services": {
            "chat": {"kind": "chat", "memory": {"weights": "256MiB"}, "backend": fake()},
            "embed": {"kind": "embeddings", "memory": {"weights": "64MiB"}, "backend": fake()},
        },
        "policy": {"name": policy},
    }


@pytest.mark.parametrize(
    ("name", "kind"),
    [("llama-swap", LlamaSwapPolicy), ("ollama+containers", OllamaContainersPolicy)],
)
def test_a_configured_baseline_runs_and_is_named_a_baseline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, kind: type
) -> None:
    cfg = load_config_data(config(name), "test")
    with caplog.at_level(logging.WARNING, logger="accelmux.runtime"):
        rt = Runtime(cfg, sample=False, data_dir=tmp_path)
    assert isinstance(rt.manager.policy, kind)
    server = rt.status()["server"]
    assert server["policy"] == name and server["baseline"] is True
    assert f"policy {name} is a baseline, run for comparison" in caplog.text


def test_accelmux_is_not_called_a_baseline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = load_config_data(config("accelmux"), "test")
    with caplog.at_level(logging.WARNING, logger="accelmux.runtime"):
        rt = Runtime(cfg, sample=False, data_dir=tmp_path)
    assert isinstance(rt.manager.policy, AccelmuxPolicy)
    assert rt.status()["server"]["baseline"] is False
    assert "baseline" not in caplog.text


def test_an_unknown_policy_is_a_config_error_listing_the_baselines() -> None:
    with pytest.raises(ConfigError) as info:
        load_config_data(config("nope"), "test")
    assert any("llama-swap" in p and "policy.name" in p for p in info.value.problems)
