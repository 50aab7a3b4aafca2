"""Policies behind the one :class:`~accelmux.core.policy.Policy` Protocol."""

from __future__ import annotations

from collections.abc import Callable

from accelmux.core.policies.accelmux import AccelmuxPolicy
from accelmux.core.policies.baselines import BASELINES, BaselineSettings
from accelmux.core.policy import Policy

_REGISTRY: dict[str, Callable[[BaselineSettings], Policy]] = {
    "accelmux": lambda _: AccelmuxPolicy(),
    **BASELINES,
}


def register(name: str, factory: Callable[[BaselineSettings], Policy]) -> None:
    _REGISTRY[name] = factory


def policy_names() -> list[str]:
    return list(_REGISTRY)


def make_policy(name: str, settings: BaselineSettings | None = None) -> Policy:
    """A fresh policy by name; the baselines read their knobs from ``settings``."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise ValueError(f"unknown policy {name!r} (known: {known})") from None
    return factory(settings or BaselineSettings())
