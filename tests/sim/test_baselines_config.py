"""The baselines' knobs (``ollama``, ``llama_swap``): defaults, validation with clear
errors, variants; the product's ``policy:`` section has none of them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from accelmux.config.load import load_config_text
from accelmux.config.schema import PolicyConfig
from accelmux.core.types import ServiceKind
from accelmux.errors import ConfigError
from accelmux.sim.baselines import (
    BaselinePolicyConfig,
    apply_variant,
    build_policy,
    parse_variant,
    split_policies,
)
from accelmux.sim.baselines.config import OllamaConfig
from accelmux.sim.baselines.policies import (
    OLLAMA_KINDS,
    PINNED_PERSISTENT,
    LlamaSwapPolicy,
    OllamaContainersPolicy,
)

BASE = """
devices: {gpu: {kind: virtual, capacity: 8GiB}}
services:
  voice: {kind: chat, class: realtime, residency: pinned, memory: {weights: 1GiB}}
  chat: {kind: chat, memory: {weights: 2GiB}}
policy:
"""


def test_defaults_are_the_shipped_ones_with_pinned_kept_forever() -> None:
    s = BaselinePolicyConfig().ollama.settings()
    assert (s.max_loaded_models, s.num_parallel, s.keep_alive_s, s.max_queue) == (3, 1, 300, 512)
    assert s.pinned_forever and s.gpu_overhead_bytes == 0 and s.hosted_kinds == OLLAMA_KINDS
    assert BaselinePolicyConfig().llama_swap.settings().groups == PINNED_PERSISTENT


def test_knobs_are_read_from_the_baselines_sections() -> None:
    cfg = BaselinePolicyConfig.model_validate(
        yaml.safe_load(
            "ollama: {max_loaded_models: null, num_parallel: 4, gpu_overhead: 512MiB,"
            " pinned_keep_alive: default, hosts: all}\n"
            "llama_swap: {layout: custom, groups: [{name: voice, members: [voice],"
            " swap: false, persistent: true}], ttl: false}\n"
        )
    )
    s = cfg.ollama.settings()
    assert s.max_loaded_models is None and s.num_parallel == 4 and not s.pinned_forever
    assert s.gpu_overhead_bytes == 512 * 1024**2 and s.hosted_kinds == frozenset(ServiceKind)
    ls = cfg.llama_swap.settings()
    assert [g.name for g in ls.groups] == ["voice"] and ls.groups[0].persistent
    assert not ls.use_ttl


def test_the_products_policy_section_has_no_baseline_knobs() -> None:
    with pytest.raises(ConfigError) as info:
        load_config_text(BASE + "  ollama: {num_parallel: 2}\n")
    assert any("policy.ollama" in p for p in info.value.problems), info.value.problems


@pytest.mark.parametrize(
    ("variant", "where"),
    [
        ("ollama+containers[max_loaded_models=0]", "max_loaded_models"),
        ("ollama+containers[num_parallel=-1]", "num_parallel"),
        ("ollama+containers[keep_alive=5]", "keep_alive"),
        ("ollama+containers[pinned_keep_alive=always]", "pinned_keep_alive"),
        ("ollama+containers[hosts=[chat, video]]", "hosts"),
        ("llama-swap[layout=custom]", "layout custom needs groups"),
        ("llama-swap[groups=[{name: g, members: ['*']}]]", "only read with layout custom"),
        (
            "llama-swap[layout=custom, groups=[{name: g, members: ['tier:gold']}]]",
            "unknown selector 'tier'",
        ),
        (
            "llama-swap[layout=custom, groups=[{name: g, members: ['class:vip']}]]",
            "class must be one of",
        ),
    ],
)
def test_bad_knobs_are_reported_with_their_key(variant: str, where: str) -> None:
    with pytest.raises(ValueError) as info:
        apply_variant(variant, PolicyConfig())
    assert where in str(info.value) and variant in str(info.value)


def test_variant_syntax() -> None:
    assert parse_variant("llama-swap") == ("llama-swap", {})
    assert parse_variant("ollama+containers[max_loaded_models=null, hosts=[chat, asr]]") == (
        "ollama+containers",
        {"max_loaded_models": None, "hosts": ["chat", "asr"]},
    )
    assert split_policies("accelmux, ollama+containers[a=1,b=2],llama-swap") == [
        "accelmux",
        "ollama+containers[a=1,b=2]",
        "llama-swap",
    ]


def test_a_variant_overrides_only_its_keys_and_names_the_policy() -> None:
    base = BaselinePolicyConfig(ollama=OllamaConfig(num_parallel=2))
    varied = apply_variant("ollama+containers[max_loaded_models=7]", base)
    assert isinstance(varied, BaselinePolicyConfig)
    assert varied.ollama.max_loaded_models == 7 and varied.ollama.num_parallel == 2
    policy = build_policy("ollama+containers[max_loaded_models=7]", base)
    assert isinstance(policy, OllamaContainersPolicy)
    assert policy.name == "ollama+containers[max_loaded_models=7]"
    assert policy.settings.max_loaded_models == 7
    swap = build_policy("llama-swap[layout=no-groups]", base)
    assert isinstance(swap, LlamaSwapPolicy) and swap.settings.groups == ()
    assert build_policy("llama-swap", base).name == "llama-swap"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nope[a=1]", "unknown policy 'nope'"),
        ("oracle[a=1]", "has no settings to vary"),
        ("ollama+containers[max_queue=0]", "max_queue"),
        ("ollama+containers[num_parallel]", "is not key=value"),
    ],
)
def test_bad_variants_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("+", r"\+")):
        apply_variant(text, PolicyConfig())


def test_the_core_registry_knows_the_baselines_only_once_their_package_is_imported() -> None:
    probe = (
        "from accelmux.core.policies import policy_names; a = policy_names(); "
        "import accelmux.sim.baselines; print(a, policy_names())"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == [
        "['accelmux']",
        "['accelmux',",
        "'independent',",
        "'static',",
        "'ollama+containers',",
        "'llama-swap',",
        "'oracle']",
    ]


def test_a_scenario_may_set_the_baselines_knobs(tmp_path: Path) -> None:
    from tests.sim.support import scenario, tiny

    data = tiny()
    data["policy"] = {"name": "ollama+containers", "ollama": {"max_loaded_models": 1}}
    scn = scenario(tmp_path, data)
    assert scn.config.policy.ollama.max_loaded_models == 1
    data["policy"] = {"ollama": {"max_loaded_modls": 1}}
    with pytest.raises(ConfigError, match="max_loaded_modls"):
        scenario(tmp_path, data)


def test_the_names_a_config_accepts_are_the_registrys() -> None:
    from accelmux.config.schema import POLICY_NAMES
    from accelmux.core.policies import policy_names

    assert set(POLICY_NAMES) == set(policy_names())  # the baselines are registered here


def test_a_config_naming_a_baseline_loads_whatever_was_imported_before() -> None:
    """``load_config`` accepts a baseline's name in a process that never imported the
    baselines (what it accepts does not depend on import order)."""
    code = (
        "import sys\n"
        "from accelmux.config.load import load_config_text\n"
        "cfg = load_config_text(sys.stdin.read())\n"
        "assert 'accelmux.sim.baselines' not in sys.modules, 'imported the baselines'\n"
        "print(cfg.policy.name)\n"
    )
    text = (
        "devices:\n  gpu: {kind: virtual, capacity: 12GiB, budget: 12GiB, headroom: 512MiB}\n"
        "services: {}\npolicy:\n  name: llama-swap\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "llama-swap"
