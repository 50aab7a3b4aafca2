"""The Manager's world: the data (:mod:`.data`), the state and its indexes (:mod:`.world`),
the one writer (:mod:`.ops`) and the read-only view parts and the shell read (:mod:`.view`).
"""

from accelmux.core.world.data import (
    EXPLAIN_LINES,
    MIN_LOAD_S,
    REQUEST_MOVES,
    STATUS_MOVES,
    RequestPhase,
    RequestState,
    ServiceState,
    reuse_rate,
)
from accelmux.core.world.ops import Change, WorldOps
from accelmux.core.world.sets import ServiceSet
from accelmux.core.world.view import LedgerView, ServiceSetView, WorldView
from accelmux.core.world.world import World

__all__ = [
    "EXPLAIN_LINES",
    "MIN_LOAD_S",
    "REQUEST_MOVES",
    "STATUS_MOVES",
    "Change",
    "LedgerView",
    "RequestPhase",
    "RequestState",
    "ServiceSet",
    "ServiceSetView",
    "ServiceState",
    "World",
    "WorldOps",
    "WorldView",
    "reuse_rate",
]
