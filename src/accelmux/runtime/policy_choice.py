"""The daemon's policy: accelmux, or a baseline of the simulator run for comparison.

``policy.name`` selects it through the policy registry. The baselines
(``accelmux.sim.baselines``: what home servers do today) are in that registry once
their package is imported, which this module does: the daemon can then run one on the
same machine and clients, to compare with accelmux. It runs at its shipped settings,
and the daemon says so in its log and in ``/admin/status`` (``server.baseline``).
"""

from __future__ import annotations

import logging

from accelmux.config.schema import PolicyConfig
from accelmux.core.policy import Policy
from accelmux.sim.baselines import build_policy, is_baseline

log = logging.getLogger("accelmux.runtime")


def daemon_policy(policy: PolicyConfig) -> Policy:
    """The policy ``policy.name`` names, with the section's knobs."""
    if is_baseline(policy.name):
        log.warning(
            "policy %s is a baseline, run for comparison with accelmux: it does not keep "
            "the memory budget the accelmux policy keeps",
            policy.name,
        )
    return build_policy(policy.name, policy)
