"""A broken invariant in the daemon is an ERROR log with the decision log, not an error
in the HTTP handler whose request made the Manager decide."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from tests.live.support import base_config, fake, live, run, settle

from accelmux.core.types import Reason, ServiceStatus
from accelmux.core.world import WorldOps, WorldView


class Overcommitting:
    """A broken policy double: it loads on demand and dispatches every waiting request
    with a lease ten times the device's usable memory, past the budget."""

    name = "overcommitting"
    infinite_memory = False
    enforces_budget = True

    def start(self, world: WorldView, ops: WorldOps, now: float) -> None:
        return None

    def decide(self, world: WorldView, ops: WorldOps, now: float) -> None:
        for req in list(world.waiting.values()):
            svc = world.services[req.service]
            usable = world.devices[svc.spec.device].usable_bytes
            if svc.is_up:
                ops.dispatch(req, reason=Reason.FITS, active_bytes=10 * usable, enforce=False)
            elif svc.status in (ServiceStatus.UNLOADED, ServiceStatus.CRASHED):
                ops.load(svc, reason=Reason.DEMAND)

    def next_wakeup(self, world: WorldView, now: float) -> float | None:
        return None


def test_a_broken_budget_is_logged_and_the_request_still_answered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = base_config(
        embed={"kind": "embeddings", "memory": {"weights": "64MiB"}, "backend": fake()}
    )

    async def body() -> None:
        async with live(cfg, tmp=tmp_path) as lv:
            lv.runtime.manager.policy = Overcommitting()
            for i in range(2):
                status, answer, _ = await lv.post(
                    "/v1/embeddings", json={"model": "embed", "input": f"text {i}"}
                )
                assert status == 200, answer
            manager = lv.runtime.manager
            await settle(lambda: not manager.world.inflight)
            reports = [d for d in manager.log if d.as_dict()["action"] == "invariant_broken"]
            assert len(reports) == 2  # once per request that went over
            assert manager.snapshot().as_dict()["counts"]["invariant_broken:budget"] == 2

    with caplog.at_level(logging.ERROR, logger="accelmux.runtime"):
        run(body())
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2, errors
    first = errors[0]
    assert "invariant broken" in first and "device gpu: decided" in first
    assert '"action": "dispatch"' in first and '"service": "embed"' in first
    assert '"action": "load"' in first  # the decisions before the round are there too
