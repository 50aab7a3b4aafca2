"""One analysis loop per camera service, each frame a request through the Manager."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from accelmux.cameras.store import EventStore
from accelmux.config.backends import WorkerBackendConfig
from accelmux.core.events import Demand
from accelmux.core.types import Reason, ServiceKind
from accelmux.errors import BackendError
from accelmux.redact import redact
from accelmux.runtime.call import Call
from accelmux.runtime.daemon import Runtime
from accelmux.runtime.requests import Refused

log = logging.getLogger("accelmux.cameras")

#: The worker endpoint that reads the next frame of a camera and detects in it.
FRAME_ENDPOINT = "/camera/frame"


#: Refusals that say the camera's model cannot run (not that the device is busy).
FAILURE_REASONS = frozenset({Reason.LOAD_FAILED, Reason.BACKEND_CRASHED})


@dataclass
class CameraState:
    """What ``GET /v1/cameras`` shows of one camera (credentials in its source are masked
    by :func:`~accelmux.redact.redact`; the real source goes only to the backend)."""

    name: str
    source: str
    fps: float
    frames: int = 0
    events: int = 0
    refused: int = 0
    errors: int = 0
    failures: int = 0  # consecutive, for the retry backoff
    last_frame_at: float | None = None
    last_error: str | None = None
    megapixels: float = 0.3
    latencies: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "object": "camera",
            "name": self.name,
            "source": redact(self.source),
            "fps": self.fps,
            "frames_analysed": self.frames,
            "events": self.events,
            "frames_refused": self.refused,
            "errors": self.errors,
            "last_frame_at": self.last_frame_at,
            "last_error": self.last_error,
        }


def camera_services(runtime: Runtime) -> dict[str, CameraState]:
    """Camera services whose backend can read frames (hosted ones)."""
    out: dict[str, CameraState] = {}
    for name, svc in runtime.cfg.services.items():
        if svc.kind is not ServiceKind.CAMERA or not isinstance(svc.backend, WorkerBackendConfig):
            continue
        options = svc.backend.options
        out[name] = CameraState(
            name=name,
            source=str(options.get("source", "sample")),
            fps=float(options.get("fps", 1.0)),
        )
    return out


class CameraRunner:
    def __init__(self, runtime: Runtime, store: EventStore) -> None:
        self.runtime = runtime
        self.store = store
        self.cameras = camera_services(runtime)
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        for state in self.cameras.values():
            self._tasks.append(asyncio.create_task(self._loop(state), name=f"camera-{state.name}"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()

    async def analyse_one(self, state: CameraState) -> dict[str, Any]:
        """Read and analyse one frame through the Manager; returns the frame's result."""
        runtime = self.runtime
        body = {"model": state.name, "source": state.source, "fps": state.fps}
        call = Call(kind=ServiceKind.CAMERA, endpoint=FRAME_ENDPOINT, body=body)
        rid = runtime.new_request_id().replace("req-", "cam-", 1)
        started = time.monotonic()
        answer = await runtime.call(
            state.name, Demand(units=state.megapixels), call, request_id=rid
        )
        if answer.status >= 400:
            raise BackendError(f"camera frame answered {answer.status}: {answer.body[:200]!r}")
        frame: dict[str, Any] = json.loads(answer.body)
        now = time.time()
        state.frames += 1
        state.last_frame_at = now
        state.megapixels = int(frame.get("width", 0)) * int(frame.get("height", 0)) / 1e6 or 0.3
        state.events += await asyncio.to_thread(self.store.record, state.name, now, frame)
        state.latencies = [*state.latencies[-99:], time.monotonic() - started]
        return frame

    @staticmethod
    def _failed(state: CameraState, error: str) -> None:
        state.errors += 1
        state.failures += 1
        state.last_error = redact(error)
        log.warning("camera %s: %s", state.name, state.last_error)

    @staticmethod
    def _backoff(state: CameraState) -> float:
        return min(30.0, 2.0 ** min(state.failures, 5))

    async def _loop(self, state: CameraState) -> None:
        period = 1.0 / max(state.fps, 1e-3)
        while True:
            started = time.monotonic()
            delay = 0.0
            try:
                await self.analyse_one(state)
                state.failures = 0
            except asyncio.CancelledError:
                raise
            except Refused as exc:
                state.refused += 1
                delay = max(0.0, float(exc.retry_after_s or 0.0))
                if exc.reason in FAILURE_REASONS:  # its model cannot load or crashed
                    # "load failed: ..." / "crashed: ...", else the refusal itself
                    self._failed(state, self.runtime.last_error(state.name) or str(exc))
                    delay = max(delay, self._backoff(state))
            except Exception as exc:  # a camera must never stop the daemon
                self._failed(state, str(exc))
                delay = self._backoff(state)
            await asyncio.sleep(max(delay, period - (time.monotonic() - started)))
