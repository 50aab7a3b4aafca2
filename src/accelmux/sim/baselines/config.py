"""The baselines' knobs (``ollama``, ``llama_swap``) and policy variants.

The knobs are no keys of the product's ``policy:`` section: :class:`BaselinePolicyConfig`
is that section with the baselines' sections added, each at the defaults its users
would configure the real systems with. A *variant* overrides some of them for one run:
``NAME[key=value,...]``, for example
``ollama+containers[max_loaded_models=7,num_parallel=4]`` or
``llama-swap[layout=no-groups]``. Values are YAML (``null``, ``[chat, asr]``); keys are
the fields of the policy's own section. :func:`build_policy` turns a policy name or a
variant and the config's ``policy:`` section into a :class:`~accelmux.core.policy.Policy`.
"""

from __future__ import annotations

from typing import Any, Literal

import yaml
from pydantic import BaseModel, ByteSize, ConfigDict, Field, ValidationError, field_validator

from accelmux.config.schema import PolicyConfig
from accelmux.core.policies import make_policy, policy_names
from accelmux.core.policy import Policy
from accelmux.core.types import Residency, ServiceClass, ServiceKind
from accelmux.sim.baselines.policies import (
    LLAMA_SWAP_KINDS,
    OLLAMA_KINDS,
    PINNED_PERSISTENT,
    BaselineSettings,
    LlamaSwapSettings,
    OllamaSettings,
    SwapGroup,
)

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
#: The selectors a llama-swap group member may use besides a service name and ``*``.
SELECTORS: dict[str, tuple[str, ...]] = {
    "residency": tuple(r.value for r in Residency),
    "class": tuple(c.label for c in ServiceClass),
    "kind": tuple(k.value for k in ServiceKind),
}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _kinds(value: object) -> object:
    return list(ServiceKind) if value == "all" else value


class OllamaConfig(_Section):
    """The ``ollama+containers`` baseline: Ollama's settings (its ``envconfig``)."""

    hosts: list[ServiceKind] = Field(
        default_factory=lambda: sorted(OLLAMA_KINDS),
        description="Service kinds Ollama serves (`all`: every kind); the others run as "
        "their own always-on processes beside it.",
    )
    max_loaded_models: int | None = Field(
        3,
        ge=1,
        le=1000,
        description="OLLAMA_MAX_LOADED_MODELS per device, counted over Ollama's own "
        "models (null: no cap).",
    )
    num_parallel: int = Field(
        1, ge=1, le=64, description="OLLAMA_NUM_PARALLEL: requests one model runs at once."
    )
    keep_alive_s: float = Field(
        300.0, ge=0, description="OLLAMA_KEEP_ALIVE: idle seconds before a model unloads."
    )
    pinned_keep_alive: Literal["forever", "default"] = Field(
        "forever",
        description="keep_alive of the pinned services: `forever` (-1) or `default` "
        "(keep_alive_s).",
    )
    gpu_overhead: ByteSize = Field(
        ByteSize(0), ge=0, description="OLLAMA_GPU_OVERHEAD: memory left out of the fit check."
    )
    max_queue: int = Field(
        512, ge=1, le=1_000_000, description="OLLAMA_MAX_QUEUE: pending requests before 503."
    )

    _hosts = field_validator("hosts", mode="before")(_kinds)

    def settings(self) -> OllamaSettings:
        return OllamaSettings(
            hosted_kinds=frozenset(self.hosts),
            max_loaded_models=self.max_loaded_models,
            num_parallel=self.num_parallel,
            keep_alive_s=self.keep_alive_s,
            pinned_forever=self.pinned_keep_alive == "forever",
            gpu_overhead_bytes=int(self.gpu_overhead),
            max_queue=self.max_queue,
        )


class LlamaSwapGroupConfig(_Section):
    """One llama-swap group (``layout: custom``)."""

    name: str = Field(pattern=_NAME, description="Group name.")
    members: list[str] = Field(
        min_length=1,
        description="Service names, `*` (every service not in an earlier group) or "
        "selectors `residency:pinned`, `class:realtime`, `kind:chat`.",
    )
    swap: bool = Field(True, description="Only one member runs at a time.")
    exclusive: bool = Field(
        True, description="Starting a member stops the other non-persistent groups."
    )
    persistent: bool = Field(False, description="Other groups never stop its members.")

    @field_validator("members")
    @classmethod
    def _check_members(cls, value: list[str]) -> list[str]:
        for member in value:
            key, sep, what = member.partition(":")
            if member == "*" or not sep:
                continue
            if key not in SELECTORS:
                raise ValueError(
                    f"member {member!r}: unknown selector {key!r} (known: {', '.join(SELECTORS)})"
                )
            if what not in SELECTORS[key]:
                raise ValueError(
                    f"member {member!r}: {key} must be one of {', '.join(SELECTORS[key])}"
                )
        return value


class LlamaSwapConfig(_Section):
    """The ``llama-swap`` baseline: what it proxies and how its groups are laid out."""

    hosts: list[ServiceKind] = Field(
        default_factory=lambda: sorted(LLAMA_SWAP_KINDS),
        description="Service kinds behind llama-swap (`all`: every kind); the others run "
        "as their own always-on processes beside it.",
    )
    layout: Literal["pinned-persistent", "no-groups", "custom"] = Field(
        "pinned-persistent",
        description="`pinned-persistent`: the pinned services in a persistent group that "
        "never swaps, the rest in one swap group (the README's advice); `no-groups`: one "
        "model at a time; `custom`: `groups`.",
    )
    groups: list[LlamaSwapGroupConfig] = Field(
        default_factory=list,
        description="Groups in order, with `layout: custom` (a service joins the first "
        "that matches; the rest form llama-swap's default swap group).",
    )
    ttl: bool = Field(
        True, description="Stop a model idle for its service's ttl_s (never a pinned one)."
    )
    preload_persistent: bool = Field(
        True, description="Start the persistent groups' models with the server."
    )

    _hosts = field_validator("hosts", mode="before")(_kinds)

    def model_post_init(self, _context: object) -> None:
        if self.layout == "custom" and not self.groups:
            raise ValueError("layout custom needs groups")
        if self.layout != "custom" and self.groups:
            raise ValueError(f"groups are only read with layout custom (layout is {self.layout})")
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise ValueError(f"group names must be unique (got {names})")

    def settings(self) -> LlamaSwapSettings:
        groups: tuple[SwapGroup, ...]
        if self.layout == "pinned-persistent":
            groups = PINNED_PERSISTENT
        elif self.layout == "no-groups":
            groups = ()
        else:
            groups = tuple(
                SwapGroup(
                    name=g.name,
                    members=tuple(g.members),
                    swap=g.swap,
                    exclusive=g.exclusive,
                    persistent=g.persistent,
                )
                for g in self.groups
            )
        return LlamaSwapSettings(
            hosted_kinds=frozenset(self.hosts),
            groups=groups,
            use_ttl=self.ttl,
            preload_persistent=self.preload_persistent,
        )


class BaselinePolicyConfig(PolicyConfig):
    """The ``policy:`` section with the knobs of the configurable baselines."""

    ollama: OllamaConfig = Field(
        default_factory=OllamaConfig, description="The ollama+containers baseline's settings."
    )
    llama_swap: LlamaSwapConfig = Field(
        default_factory=LlamaSwapConfig, description="The llama-swap baseline's settings."
    )


#: Each configurable baseline -> its section of :class:`BaselinePolicyConfig`.
SECTIONS: dict[str, str] = {"ollama+containers": "ollama", "llama-swap": "llama_swap"}


def with_baselines(policy: PolicyConfig) -> BaselinePolicyConfig:
    """``policy`` with the baselines' sections (at their defaults where it has none)."""
    if isinstance(policy, BaselinePolicyConfig):
        return policy
    return BaselinePolicyConfig.model_validate(policy.model_dump())


def baseline_settings(policy: BaselinePolicyConfig) -> BaselineSettings:
    """The baselines' settings from their sections (``ollama`` and ``llama_swap``)."""
    return BaselineSettings(
        ollama=policy.ollama.settings(), llama_swap=policy.llama_swap.settings()
    )


def _split_top(text: str) -> list[str]:
    """Split ``text`` on the commas outside brackets and braces."""
    parts: list[str] = []
    depth = 0
    current = ""
    for ch in text:
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def split_policies(text: str) -> list[str]:
    """A comma-separated list of policies and variants (commas inside ``[...]`` kept)."""
    return _split_top(text)


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """``NAME[key=value,...]`` -> (NAME, overrides); a bare name has none."""
    text = text.strip()
    if "[" not in text:
        return text, {}
    name, _, rest = text.partition("[")
    if not rest.endswith("]"):
        raise ValueError(f"variant {text!r}: expected NAME[key=value,...]")
    overrides: dict[str, Any] = {}
    for part in _split_top(rest[:-1]):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"variant {text!r}: {part!r} is not key=value")
        try:
            overrides[key.strip()] = yaml.safe_load(value.strip())
        except yaml.YAMLError as exc:
            raise ValueError(f"variant {text!r}: value of {key.strip()!r}: {exc}") from None
    return name.strip(), overrides


def apply_variant(text: str, policy: PolicyConfig) -> PolicyConfig:
    """``policy`` with the variant's overrides applied and validated (a baseline's
    variant gives a :class:`BaselinePolicyConfig`).

    Raises ValueError naming the variant, the key and the problem.
    """
    name, overrides = parse_variant(text)
    if name not in policy_names():
        known = ", ".join(sorted(policy_names()))
        raise ValueError(f"unknown policy {name!r} (known: {known})")
    if not overrides:
        return policy
    if name == "accelmux":
        # Its one variant setting: heuristics turned off (``accelmux[disable=[a,b]]``).
        unknown = sorted(set(overrides) - {"disable"})
        if unknown:
            raise ValueError(f"variant {text!r}: accelmux varies only 'disable' (got {unknown})")
        try:
            return type(policy).model_validate(
                {**policy.model_dump(), "disable": overrides["disable"]}
            )
        except ValidationError as exc:
            problems = "; ".join(str(e["msg"]) for e in exc.errors())
            raise ValueError(f"variant {text!r}: {problems}") from None
    section = SECTIONS.get(name)
    if section is None:
        raise ValueError(f"variant {text!r}: policy {name!r} has no settings to vary")
    policy = with_baselines(policy)
    current: BaseModel = getattr(policy, section)
    try:
        updated = type(current).model_validate({**current.model_dump(), **overrides})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or section}: {e['msg']} (got {e.get('input')!r})"
            for e in exc.errors()
        )
        raise ValueError(f"variant {text!r}: {problems}") from None
    return policy.model_copy(update={section: updated})


def build_policy(text: str, policy: PolicyConfig) -> Policy:
    """The policy named by ``text`` (a name or a variant), with the config's knobs."""
    name, _ = parse_variant(text)
    configured = apply_variant(text, policy)
    built = make_policy(name, baseline_settings(with_baselines(configured)))
    if text.strip() != name:
        built.name = text.strip()
    return built
