"""A service's ``degrade:`` section: validated with a clear error for each bad value, and
turned into the forms the Manager chooses between (core/degrade.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from accelmux.cli import main
from accelmux.config.load import load_config_data
from accelmux.config.specs import to_manager_spec
from accelmux.core.degrade import VariantMode
from accelmux.errors import ConfigError


def _config(degrade: dict[str, Any] | None, **chat: Any) -> dict[str, Any]:
    service: dict[str, Any] = {
        "kind": "chat",
        "device": "gpu",
        "memory": {
            "weights": "4GiB",
            "runtime": "300MiB",
            "kv_per_token": "128KiB",
            "kv_floor": "256MiB",
            "kv_ceiling": "1GiB",
        },
        "backend": {"type": "fake"},
        **chat,
    }
    if degrade is not None:
        service["degrade"] = degrade
    return {
        "devices": {
            "gpu": {"kind": "nvidia", "index": 0, "capacity": "8GiB"},
            "cpu": {"kind": "host", "capacity": "32GiB"},
        },
        "services": {"chat": service},
    }


FULL = {"fallback_device": "cpu", "min_gpu_layers": 8, "max_gpu_layers": 24, "layers": 33}


def _problems(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config_data(data, "test")
    return info.value.problems


def test_forms_best_first_with_their_layers_and_memory() -> None:
    spec = to_manager_spec(load_config_data(_config(FULL), "test"))
    forms = [s for s in spec.services if s.group == "chat"]
    assert [s.name for s in forms] == [
        "chat@gpu",
        "chat@gpu:24",
        "chat@gpu:19",
        "chat@gpu:13",
        "chat@gpu:8",
        "chat@cpu",
    ]
    modes = [s.variant.mode for s in forms if s.variant is not None]
    assert modes == [VariantMode.FULL] + [VariantMode.OFFLOAD] * 4 + [VariantMode.CPU]
    assert [s.variant.rank for s in forms if s.variant is not None] == list(range(6))
    full, *offload, cpu = forms
    # an offload form holds its layers' share of the weights and KV cache on the GPU
    for form in offload:
        assert form.variant is not None and form.device == "gpu"
        share = form.variant.n_gpu_layers / 33
        assert form.profile.weights == round(full.profile.weights * share)
        assert form.profile.kv_ceiling < full.profile.kv_ceiling
        assert 1.0 < form.variant.slowdown < cpu.variant.slowdown  # type: ignore[union-attr]
    assert cpu.device == "cpu" and cpu.profile == full.profile
    assert cpu.variant is not None and cpu.variant.slowdown == 8.0


def test_a_service_without_degrade_is_unchanged() -> None:
    spec = to_manager_spec(load_config_data(_config(None), "test"))
    (chat,) = spec.services
    assert chat.name == "chat" and chat.group == "" and chat.variant is None


@pytest.mark.parametrize(
    ("degrade", "chat", "expected"),
    [
        ({"fallback_device": "nope"}, {}, "services.chat.degrade.fallback_device: unknown device"),
        ({"fallback_device": "gpu"}, {}, "must be a host device other than the service's"),
        ({"min_gpu_layers": 8, "max_gpu_layers": 24}, {}, "services.chat.degrade.layers: required"),
        ({"min_gpu_layers": 8, "max_gpu_layers": 40, "layers": 33}, {}, "fewer than all 33"),
        ({"fallback_device": "cpu"}, {"device": None}, "a service that degrades runs on one GPU"),
        ({"fallback_device": "cpu"}, {"residency": "pinned"}, "a pinned service never leaves"),
        (
            {"min_gpu_layers": 2, "max_gpu_layers": 4, "layers": 33},
            {"kind": "embeddings"},
            "a layer range is for llama.cpp LLMs",
        ),
        (
            {"fallback_device": "cpu"},
            {"backend": {"type": "external", "argv": ["llama-server", "--port", "{port}"]}},
            "degrading needs backend type worker",
        ),
    ],
)
def test_bad_sections_are_named(
    degrade: dict[str, Any], chat: dict[str, Any], expected: str
) -> None:
    data = _config(degrade, **chat)
    if chat.get("device", "gpu") is None:
        del data["services"]["chat"]["device"]
    problems = _problems(data)
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize(
    ("degrade", "expected"),
    [
        ({}, "declare a fallback_device, a layer range, or both"),
        ({"min_gpu_layers": 8}, "give min_gpu_layers and max_gpu_layers together"),
        ({"min_gpu_layers": 9, "max_gpu_layers": 8, "layers": 33}, "is more than max_gpu_layers"),
        ({"fallback_device": "cpu", "cpu_slowdown": 0.5}, "cpu_slowdown"),
        ({"fallback_device": "cpu", "min_gpu_layers": 0, "max_gpu_layers": 3}, "min_gpu_layers"),
        ({"fallback_device": "cpu", "spare": 1}, "spare"),
    ],
)
def test_field_errors_are_named(degrade: dict[str, Any], expected: str) -> None:
    problems = _problems(_config(degrade))
    assert any(expected in p and "degrade" in p for p in problems), problems


def test_check_reports_a_bad_section_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "accelmux.yaml"
    path.write_text(yaml.safe_dump(_config({"fallback_device": "nope"})))
    assert main(["check", str(path)]) == 2
    captured = capsys.readouterr()
    assert "services.chat.degrade.fallback_device: unknown device (got 'nope')" in captured.err
    assert "Traceback" not in captured.err + captured.out


def test_a_model_larger_than_its_gpu_may_degrade() -> None:
    """Without degrade such a service is refused; with it, its lesser forms run."""
    big = {"memory": {"weights": "12GiB", "runtime": "300MiB"}}
    assert any("needs" in p for p in _problems(_config(None, **big)))
    spec = to_manager_spec(load_config_data(_config({"fallback_device": "cpu"}, **big), "test"))
    assert [s.name for s in spec.services] == ["chat@gpu", "chat@cpu"]
