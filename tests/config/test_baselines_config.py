"""The baselines' knobs in ``policy:``: defaults, validation with clear errors, variants."""

from __future__ import annotations

import pytest

from accelmux.config.baselines import apply_variant, build_policy, parse_variant, split_policies
from accelmux.config.load import load_config_text
from accelmux.config.schema import PolicyConfig
from accelmux.core.policies.baselines import (
    OLLAMA_KINDS,
    PINNED_PERSISTENT,
    LlamaSwapPolicy,
    OllamaContainersPolicy,
)
from accelmux.core.types import ServiceKind
from accelmux.errors import ConfigError

BASE = """
devices: {gpu: {kind: virtual, capacity: 8GiB}}
services:
  voice: {kind: chat, class: realtime, residency: pinned, memory: {weights: 1GiB}}
  chat: {kind: chat, memory: {weights: 2GiB}}
policy:
"""


def _load(policy: str) -> PolicyConfig:
    return load_config_text(BASE + policy).policy


def _problems(policy: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config_text(BASE + policy)
    return info.value.problems


def test_defaults_are_the_shipped_ones_with_pinned_kept_forever() -> None:
    s = PolicyConfig().ollama.settings()
    assert (s.max_loaded_models, s.num_parallel, s.keep_alive_s, s.max_queue) == (3, 1, 300, 512)
    assert s.pinned_forever and s.gpu_overhead_bytes == 0 and s.hosted_kinds == OLLAMA_KINDS
    assert PolicyConfig().llama_swap.settings().groups == PINNED_PERSISTENT


def test_knobs_are_read_from_the_policy_section() -> None:
    cfg = _load(
        "  ollama: {max_loaded_models: null, num_parallel: 4, gpu_overhead: 512MiB,"
        " pinned_keep_alive: default, hosts: all}\n"
        "  llama_swap: {layout: custom, groups: [{name: voice, members: [voice],"
        " swap: false, persistent: true}], ttl: false}\n"
    )
    s = cfg.ollama.settings()
    assert s.max_loaded_models is None and s.num_parallel == 4 and not s.pinned_forever
    assert s.gpu_overhead_bytes == 512 * 1024**2 and s.hosted_kinds == frozenset(ServiceKind)
    ls = cfg.llama_swap.settings()
    assert [g.name for g in ls.groups] == ["voice"] and ls.groups[0].persistent
    assert not ls.use_ttl


@pytest.mark.parametrize(
    ("policy", "where"),
    [
        ("  ollama: {max_loaded_models: 0}\n", "policy.ollama.max_loaded_models"),
        ("  ollama: {num_parallel: -1}\n", "policy.ollama.num_parallel"),
        ("  ollama: {keep_alive: 5}\n", "policy.ollama.keep_alive"),
        ("  ollama: {pinned_keep_alive: always}\n", "policy.ollama.pinned_keep_alive"),
        ("  ollama: {hosts: [chat, video]}\n", "policy.ollama.hosts"),
        ("  llama_swap: {layout: custom}\n", "layout custom needs groups"),
        (
            "  llama_swap: {groups: [{name: g, members: ['*']}]}\n",
            "only read with layout custom",
        ),
        (
            "  llama_swap: {layout: custom, groups: [{name: g, members: ['tier:gold']}]}\n",
            "unknown selector 'tier'",
        ),
        (
            "  llama_swap: {layout: custom, groups: [{name: g, members: ['class:vip']}]}\n",
            "class must be one of",
        ),
        (
            "  llama_swap: {layout: custom, groups: [{name: g, members: [nosuch]}]}\n",
            "policy.llama_swap.groups.0.members: unknown service (got 'nosuch')",
        ),
    ],
)
def test_bad_knobs_are_reported_with_their_key(policy: str, where: str) -> None:
    assert any(where in p for p in _problems(policy)), _problems(policy)


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
    base = _load("  ollama: {num_parallel: 2}\n")
    varied = apply_variant("ollama+containers[max_loaded_models=7]", base)
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
