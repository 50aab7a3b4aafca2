"""The world's data and its one writer: the status and phase move tables refuse a move
they do not list, and every operation notes what it changed."""

from __future__ import annotations

import pytest

from accelmux.core.types import ServiceStatus
from accelmux.core.world import STATUS_MOVES, RequestPhase
from accelmux.errors import InvariantError

from .support import arrive, done, loaded, manager, service


def test_a_status_move_the_table_does_not_list_is_refused() -> None:
    m = manager(service("img"))
    svc = m.world.services["img"]
    assert ServiceStatus.LOADED not in STATUS_MOVES[ServiceStatus.UNLOADED]
    with pytest.raises(InvariantError, match="unloaded -> loaded"):
        m.ops.set_status(svc, ServiceStatus.LOADED)


def test_a_request_moves_through_its_phases_and_an_ended_one_stays_ended() -> None:
    m = manager(service("img"))
    m.start(0.0)
    m.handle(arrive("r1", "img"), 0.0)
    req = m.world.waiting["r1"]
    assert req.phase is RequestPhase.WAITING
    m.handle(loaded("img"), 1.0)
    assert req.phase is RequestPhase.RUNNING and not req.paused and req.pausing is None
    m.handle(done("r1"), 2.0)
    assert req.phase is RequestPhase.ENDED
    with pytest.raises(InvariantError, match="ended -> running"):
        req.move_to(RequestPhase.RUNNING)


def test_each_call_notes_what_its_operations_changed() -> None:
    m = manager(service("img"))
    m.start(0.0)
    m.handle(arrive("r1", "img"), 0.0)
    changes = {(c.op, c.service, c.device, c.request) for c in m.last_changes}
    assert ("waiting", "img", "gpu", "r1") in changes  # it joined the queue
    assert ("Load", "img", "gpu", None) in changes  # its service loads for it
    assert ("status", "img", "gpu", None) in changes  # loading
    assert ("Enqueue", "img", "gpu", "r1") in changes  # it waits for the load
    m.handle(loaded("img"), 1.0)
    assert {(c.op, c.request) for c in m.last_changes} >= {("status", None), ("Dispatch", "r1")}
