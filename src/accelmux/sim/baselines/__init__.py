"""The baselines: what home servers do today, and the oracle upper bound.

They are the simulator's yardsticks, not the product: ``policies`` holds the five
policies (``independent``, ``static``, ``ollama+containers``, ``llama-swap``,
``oracle``), ``config`` their knobs and the variants that vary them. Importing this
package adds them to the policy registry (``accelmux.core.policies.register``), so
``make_policy`` and ``policy.name`` know them; the core names none of them. The
daemon runs one only when its config names it, for comparison.
"""

from __future__ import annotations

from accelmux.core.policies import make_policy, policy_names, register
from accelmux.sim.baselines.config import (
    BaselinePolicyConfig,
    apply_variant,
    build_policy,
    parse_variant,
    split_policies,
)
from accelmux.sim.baselines.policies import BASELINES, BaselineSettings

__all__ = [
    "BASELINES",
    "BaselinePolicyConfig",
    "BaselineSettings",
    "apply_variant",
    "build_policy",
    "is_baseline",
    "make_policy",
    "parse_variant",
    "policy_names",
    "register_baselines",
    "split_policies",
]


def register_baselines() -> None:
    """Add the baselines to the policy registry (again: no change)."""
    for name, factory in BASELINES.items():
        register(name, factory)


def is_baseline(text: str) -> bool:
    """Whether ``text`` (a policy name or a variant) names one of the baselines."""
    return parse_variant(text)[0] in BASELINES


register_baselines()
