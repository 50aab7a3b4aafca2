"""A service's ``shrink:`` section: validated with a clear error for each bad value, and
given to the Manager as its :class:`~accelmux.core.shrink.BatchShrink`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from accelmux.cli import main
from accelmux.config.load import load_config_data
from accelmux.config.specs import to_manager_spec
from accelmux.core.shrink import BatchShrink
from accelmux.errors import ConfigError


def _config(shrink: dict[str, Any] | None, **indexer: Any) -> dict[str, Any]:
    service: dict[str, Any] = {
        "kind": "embeddings",
        "class": "batch",
        "device": "gpu",
        "concurrency": 4,
        "memory": {"weights": "1GiB", "workspace": "64MiB", "per_unit": "8MiB"},
        "backend": {"type": "fake"},
        **indexer,
    }
    if shrink is not None:
        service["shrink"] = shrink
    return {
        "devices": {"gpu": {"kind": "nvidia", "index": 0, "capacity": "8GiB"}},
        "services": {"indexer": service},
    }


def _problems(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config_data(data, "test")
    return info.value.problems


def test_the_section_reaches_the_manager() -> None:
    spec = to_manager_spec(load_config_data(_config({"min_batch_fraction": 0.125}), "test"))
    (indexer,) = spec.services
    assert indexer.shrink == BatchShrink(min_fraction=0.125, min_parallel=1)
    plain = to_manager_spec(load_config_data(_config(None), "test"))
    assert plain.services[0].shrink is None


@pytest.mark.parametrize(
    ("shrink", "indexer", "expected"),
    [
        ({"min_batch_fraction": 1.0}, {}, "min_batch_fraction"),
        ({"min_batch_fraction": 0}, {}, "min_batch_fraction"),
        ({"min_parallel": 0}, {}, "min_parallel"),
        ({"batch": 3}, {}, "batch"),
        ({}, {"class": "interactive"}, "services.indexer.shrink: only batch or background"),
        (
            {"min_parallel": 8},
            {},
            "services.indexer.shrink.min_parallel: more than its concurrency",
        ),
        (
            {},
            {"memory": {"weights": "1GiB", "workspace": "64MiB"}},
            "services.indexer.shrink: memory.per_unit is 0",
        ),
    ],
)
def test_bad_sections_are_named(
    shrink: dict[str, Any], indexer: dict[str, Any], expected: str
) -> None:
    problems = _problems(_config(shrink, **indexer))
    assert any(expected in p for p in problems), problems


def test_check_reports_a_bad_section_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "accelmux.yaml"
    path.write_text(yaml.safe_dump(_config({}, **{"class": "realtime"})))
    assert main(["check", str(path)]) == 2
    captured = capsys.readouterr()
    assert "services.indexer.shrink: only batch or background" in captured.err
    assert "Traceback" not in captured.err + captured.out
