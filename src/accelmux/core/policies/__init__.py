"""Policies behind the one :class:`~accelmux.core.policy.Policy` Protocol."""

from __future__ import annotations

from collections.abc import Callable

from accelmux.core.policies.accelmux import AccelmuxPolicy
from accelmux.core.policy import Policy

_REGISTRY: dict[str, Callable[[], Policy]] = {"accelmux": AccelmuxPolicy}


def register(name: str, factory: Callable[[], Policy]) -> None:
    _REGISTRY[name] = factory


def policy_names() -> list[str]:
    _load_baselines()
    return list(_REGISTRY)


def make_policy(name: str) -> Policy:
    _load_baselines()
    try:
        return _REGISTRY[name]()
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise ValueError(f"unknown policy {name!r} (known: {known})") from None


def _load_baselines() -> None:
    import importlib

    try:
        baselines = importlib.import_module("accelmux.core.policies.baselines")
    except ModuleNotFoundError:  # until the baselines module exists
        return
    for pname, factory in baselines.BASELINES.items():
        _REGISTRY.setdefault(pname, factory)
