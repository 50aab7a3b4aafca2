"""The policy Protocol: the accelmux policy and every baseline implement it.

The Manager applies an event's bookkeeping to the :class:`~accelmux.core.state.World`
first (releasing leases, marking loads done, reconciling measurements), then calls
``policy.decide(world, now)``. The policy acts only through the World's mutators, so
every action is recorded and the ledger stays consistent; ``tests/core/
test_policy_mutators.py`` fails on a policy that writes the World's state itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from accelmux.core.events import Demand

from .accelmux.state import ServiceState, World


class Policy(Protocol):
    #: Short name used in reports ("accelmux", "llama-swap", or a variant such as
    #: "ollama+containers[max_loaded_models=7]").
    name: str
    #: True when the simulator should give this policy infinite memory (the oracle).
    infinite_memory: bool
    #: True when the policy keeps committed <= budget - headroom (checked by the Manager).
    enforces_budget: bool

    def start(self, world: World, now: float) -> None:
        """Called once before the first event: preload what the policy wants resident."""
        ...

    def decide(self, world: World, now: float) -> None:
        """React to the world as it is now: dispatch, queue, load, evict, resize, reject."""
        ...

    def next_wakeup(self, world: World, now: float) -> float | None:
        """The next time a Tick is needed (a TTL, window edge or backoff), or None."""
        ...


class PlacingPolicy(Policy, Protocol):
    """A policy that places: it routes each request for a service with replicas on
    several devices (:mod:`accelmux.core.placement`). A policy without ``route`` gets
    :func:`~accelmux.core.placement.first_up`: one replica, never two."""

    def route(self, world: World, replicas: Sequence[ServiceState], demand: Demand) -> ServiceState:
        """The replica a new request of ``demand`` waits on."""
        ...
