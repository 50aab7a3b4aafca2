"""The executor carries Pause and Resume to the service's backend, in order with the
service's other operations; a pause is acknowledged (PauseFinished) or refused
(PauseRefused, with the backend's reason), a refused resume is logged, not raised."""

from __future__ import annotations

import asyncio
from typing import Any

from accelmux.config.load import load_config_data
from accelmux.core.actions import Pause, Resume, Unload
from accelmux.core.events import PauseFinished, PauseRefused
from accelmux.core.types import Reason, Tier
from accelmux.errors import BackendError
from accelmux.runtime.executor import ActionExecutor
from accelmux.runtime.metrics import Metrics

from .support import base_config


class Recorder:
    """Just what the executor calls for these actions; ``slow`` pauses take a while."""

    service = "chat"

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    async def pause(self, request_id: str, *, park: bool) -> None:
        await asyncio.sleep(0.05)  # a pause waits for the next token
        self.calls.append(("pause", request_id, park))

    async def resume(self, request_id: str) -> None:
        if request_id == "unknown":
            raise BackendError("chat: no request 'unknown' to resume")
        self.calls.append(("resume", request_id))

    async def unload(self, *, tier: Tier = Tier.COLD) -> None:
        self.calls.append(("unload", tier))


def test_pause_and_resume_reach_the_backend_in_order() -> None:
    async def body() -> None:
        backend = Recorder()
        events: list[Any] = []
        executor = ActionExecutor(
            load_config_data(base_config(), "test"),
            {"chat": backend},  # type: ignore[dict-item]
            submit=events.append,
            deliver=lambda action: None,
            metrics=Metrics(lambda: {}),
            activity={},
        )
        pause = Pause(
            request_id="r1", service="chat", attempt=1, park=True, reason=Reason.TIME_SHARE
        )
        executor.execute(pause)
        executor.execute(Unload(service="chat", reason=Reason.SWAP, tier=Tier.PARKED))
        executor.execute(
            Resume(request_id="r1", service="chat", attempt=1, lease_bytes=0, reason=Reason.RESUMED)
        )
        executor.execute(
            Resume(
                request_id="unknown",
                service="chat",
                attempt=1,
                lease_bytes=0,
                reason=Reason.RESUMED,
            )
        )
        while executor.tasks:
            await asyncio.gather(*executor.tasks)
        assert backend.calls == [("pause", "r1", True), ("unload", Tier.PARKED), ("resume", "r1")]
        assert executor.last_errors["chat"].startswith("resume failed: chat: no request")
        assert [type(e).__name__ for e in events] == ["PauseFinished", "Unloaded"]
        assert events[0] == PauseFinished(request_id="r1", attempt=1)

    asyncio.run(body())


class Refuser(Recorder):
    async def pause(self, request_id: str, *, park: bool) -> None:
        raise BackendError(f"chat: {request_id} cannot be paused: it names tools")


def test_a_pause_the_backend_cannot_carry_out_is_reported_refused() -> None:
    async def body() -> None:
        events: list[Any] = []
        executor = ActionExecutor(
            load_config_data(base_config(), "test"),
            {"chat": Refuser()},  # type: ignore[dict-item]
            submit=events.append,
            deliver=lambda action: None,
            metrics=Metrics(lambda: {}),
            activity={},
        )
        executor.execute(
            Pause(request_id="r7", service="chat", attempt=2, park=True, reason=Reason.TIME_SHARE)
        )
        while executor.tasks:
            await asyncio.gather(*executor.tasks)
        (refused,) = events
        assert isinstance(refused, PauseRefused)
        assert (refused.request_id, refused.attempt) == ("r7", 2)
        assert "it names tools" in refused.error
        assert executor.last_errors["chat"].startswith("pause failed:")

    asyncio.run(body())
