"""The ablation switches are one typed set of names (an unknown one is refused), read as a
frozen record of booleans."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from accelmux.config.load import load_config_text
from accelmux.core.policies.accelmux import HEURISTICS
from accelmux.core.specs import PolicyKnobs
from accelmux.core.switches import DESCRIPTIONS, SWITCH_NAMES, Switch, Switches
from accelmux.errors import ConfigError
from accelmux.sim.baselines import apply_variant

SRC = Path(__file__).resolve().parents[2] / "src"

CONFIG = """
devices:
  gpu: {{kind: virtual, capacity: 12GiB, budget: 12GiB, headroom: 512MiB}}
services: {{}}
policy:
  disable: {disable}
"""


def test_every_switch_has_a_description_and_heuristics_lists_them_all() -> None:
    assert set(DESCRIPTIONS) == set(Switch)
    assert list(HEURISTICS) == [s.value for s in Switch]
    assert frozenset(HEURISTICS) == SWITCH_NAMES


def test_knobs_refuse_an_unknown_switch_at_construction() -> None:
    with pytest.raises(ValueError, match="'preemptoin'") as err:
        PolicyKnobs(disabled=frozenset({"preemption", "preemptoin"}))
    assert "known: " in str(err.value) and "preemption" in str(err.value)


def test_a_misspelt_switch_is_no_attribute() -> None:
    knobs = PolicyKnobs()
    with pytest.raises(AttributeError, match="ballooning_typo"):
        knobs.switches.ballooning_typo  # type: ignore[attr-defined]  # noqa: B018


def test_the_record_has_one_boolean_per_switch() -> None:
    assert [f.name for f in fields(Switches)] == [s.value for s in Switch]
    knobs = PolicyKnobs(disabled=frozenset({"preemption"}))
    assert not knobs.switches.preemption
    assert knobs.switches.calibration
    assert knobs.switches == Switches.from_disabled(["preemption"])
    assert not hasattr(knobs, "enabled")  # no lookup by string is left


def test_no_switch_is_read_by_its_name_as_a_string() -> None:
    """Every heuristic is read as ``switches.<name>``: no ``enabled("...")`` is left."""
    for path in SRC.rglob("*.py"):
        assert ".enabled(" not in path.read_text(encoding="utf-8"), path


def test_config_refuses_an_unknown_switch() -> None:
    with pytest.raises(ConfigError, match="teleport"):
        load_config_text(CONFIG.format(disable="[teleport]"))


def test_a_scenario_variant_refuses_an_unknown_switch() -> None:
    policy = load_config_text(CONFIG.format(disable="[]")).policy
    with pytest.raises(ValueError, match="teleport"):
        apply_variant("accelmux[disable=[teleport]]", policy)
    assert apply_variant("accelmux[disable=[pause]]", policy).disable == ["pause"]
