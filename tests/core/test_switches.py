"""The ablation switches are one typed set of names: an unknown one is refused."""

from __future__ import annotations

import pytest

from accelmux.config.load import load_config_text
from accelmux.core.policies.accelmux import HEURISTICS
from accelmux.core.specs import PolicyKnobs
from accelmux.core.switches import DESCRIPTIONS, SWITCH_NAMES, Switch
from accelmux.errors import ConfigError
from accelmux.sim.baselines import apply_variant

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


def test_enabled_refuses_an_unknown_switch() -> None:
    knobs = PolicyKnobs()
    with pytest.raises(ValueError, match="'ballooning_typo'"):
        knobs.enabled("ballooning_typo")


def test_enabled_reads_a_switch_and_its_name_alike() -> None:
    knobs = PolicyKnobs(disabled=frozenset({"preemption"}))
    assert not knobs.enabled(Switch.PREEMPTION)
    assert not knobs.enabled("preemption")
    assert knobs.enabled(Switch.CALIBRATION)


def test_config_refuses_an_unknown_switch() -> None:
    with pytest.raises(ConfigError, match="teleport"):
        load_config_text(CONFIG.format(disable="[teleport]"))


def test_a_scenario_variant_refuses_an_unknown_switch() -> None:
    policy = load_config_text(CONFIG.format(disable="[]")).policy
    with pytest.raises(ValueError, match="teleport"):
        apply_variant("accelmux[disable=[teleport]]", policy)
    assert apply_variant("accelmux[disable=[pause]]", policy).disable == ["pause"]
