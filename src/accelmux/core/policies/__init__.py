"""Policies behind the one :class:`~accelmux.core.policy.Policy` Protocol.

The product's policy is ``accelmux``. Others join the registry through :func:`register`:
the simulator's baselines (``accelmux.sim.baselines``, what home servers do today) do so
when that package is imported, so the core names none of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from accelmux.core.policies.accelmux import AccelmuxPolicy
from accelmux.core.policy import Policy

#: A policy's factory: it gets the settings ``make_policy`` was given (None: its own
#: defaults); only the policies that have knobs read them.
PolicyFactory = Callable[[Any], Policy]

_REGISTRY: dict[str, PolicyFactory] = {"accelmux": lambda _: AccelmuxPolicy()}


def register(name: str, factory: PolicyFactory) -> None:
    _REGISTRY[name] = factory


def policy_names() -> list[str]:
    return list(_REGISTRY)


def make_policy(name: str, settings: object = None) -> Policy:
    """A fresh policy by name; a policy with knobs reads them from ``settings``."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise ValueError(f"unknown policy {name!r} (known: {known})") from None
    return factory(settings)
