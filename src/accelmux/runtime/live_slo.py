"""Each service's latency objectives (``services.NAME.slo``), checked on the live daemon.

Every request the Manager admits or refuses is judged when it ends, by the rule the
simulator's report uses (:mod:`accelmux.sim.metrics`), so that live and simulated
attainment mean the same thing:

* it meets its objectives when it was served, within ``latency_s`` of its arrival at the
  gateway, and, for an LLM, its first token came within ``ttft_s`` and its mean time
  between tokens (the gaps between stream chunks) is within ``tbt_s``; a non-streamed LLM
  answer's first token is its whole answer (no gaps to judge);
* a refused or failed request (a ``Refused``, a backend error, a 5xx answer) is a miss;
* a 4xx answer (the client's own mistake) and a request the client gave up on are left
  out; a service with no objective set meets them whenever it serves.

Attainment is the share of requests that met their objectives over the last
:data:`WINDOW_S` seconds, per service (the name clients use) and per class. A request's
timing travels with it in a context variable: the gateway's stream timer
(:class:`accelmux.runtime.live_latency.StreamTimer`) notes each chunk there, and
:meth:`LiveSlo.track` judges the request when ``Runtime.run_request`` returns or raises.
"""

from __future__ import annotations

import contextvars
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

#: The sliding window of attainment, seconds.
WINDOW_S = 300.0
#: Judged requests kept per service (the oldest go first).
MAX_KEPT = 8192


@dataclass(frozen=True, slots=True)
class Objective:
    """One service's objectives (None: none set)."""

    latency_s: float | None = None
    ttft_s: float | None = None
    tbt_s: float | None = None
    llm: bool = False

    def as_dict(self) -> dict[str, float | None]:
        return {"latency_s": self.latency_s, "ttft_s": self.ttft_s, "tbt_s": self.tbt_s}


@dataclass(slots=True)
class RequestTiming:
    """One request's times (on the LiveSlo's clock), filled in as its answer goes out."""

    arrived: float
    first_chunk: float | None = None
    last_chunk: float | None = None
    chunks: int = 0

    def chunk(self, now: float) -> None:
        if self.first_chunk is None:
            self.first_chunk = now
        self.last_chunk = now
        self.chunks += 1


#: The timing of the request the running task serves (None outside one).
CURRENT: contextvars.ContextVar[RequestTiming | None] = contextvars.ContextVar(
    "accelmux_request_timing", default=None
)


def met(objective: Objective, timing: RequestTiming, finished: float) -> bool:
    """Whether a served request met ``objective`` (the simulator's rule)."""
    if objective.latency_s is not None and finished - timing.arrived > objective.latency_s + 1e-9:
        return False
    if not objective.llm:
        return True
    first = timing.first_chunk if timing.first_chunk is not None else finished
    if objective.ttft_s is not None and first - timing.arrived > objective.ttft_s + 1e-9:
        return False
    if objective.tbt_s is not None and timing.chunks > 1 and timing.last_chunk is not None:
        tbt = (timing.last_chunk - first) / (timing.chunks - 1)
        if tbt > objective.tbt_s + 1e-9:
            return False
    return True


@dataclass(slots=True)
class _Judged:
    """One service's judged requests in the window, oldest first, with how many of them
    met their objectives kept as they come and go (a status read counts nothing)."""

    window_s: float
    results: deque[tuple[float, bool]] = field(default_factory=deque)
    met: int = 0

    def add(self, now: float, ok: bool) -> None:
        if len(self.results) >= MAX_KEPT:
            self._drop_oldest()
        self.results.append((now, ok))
        self.met += ok

    def counts(self, now: float) -> tuple[int, int]:
        results = self.results
        while results and results[0][0] < now - self.window_s:
            self._drop_oldest()
        return len(results), self.met

    def _drop_oldest(self) -> None:
        self.met -= self.results.popleft()[1]


def summary(requests: int, met_count: int, window_s: float) -> dict[str, Any]:
    return {
        "window_s": window_s,
        "requests": requests,
        "met": met_count,
        "attainment": round(met_count / requests, 4) if requests else None,
    }


class LiveSlo:
    """Per service and per class attainment of the objectives, over a sliding window."""

    def __init__(
        self,
        objectives: Mapping[str, Objective],
        classes: Mapping[str, str],
        *,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.objectives = dict(objectives)
        self.classes = dict(classes)
        self.window_s = window_s
        self.clock = clock
        self._judged: dict[str, _Judged] = {}

    @contextmanager
    def track(self, service: str) -> Iterator[Callable[[bool], None]]:
        """Time one request of ``service`` while the block runs; call the yielded
        function with whether it was served (False: refused or failed) to judge it. A
        block left without that call (a client gone, a 4xx) is not judged."""
        timing = RequestTiming(arrived=self.clock())
        token = CURRENT.set(timing)

        def judge(served: bool) -> None:
            objective = self.objectives.get(service, Objective())
            finished = self.clock()
            self.record(service, served and met(objective, timing, finished), finished)

        try:
            yield judge
        finally:
            CURRENT.reset(token)

    def record(self, service: str, ok: bool, now: float | None = None) -> None:
        judged = self._judged.get(service)
        if judged is None:
            judged = self._judged[service] = _Judged(self.window_s)
        judged.add(self.clock() if now is None else now, ok)

    def service(self, name: str) -> dict[str, Any]:
        """One service's objectives and attainment over the window."""
        requests, met_count = self._counts(name, self.clock())
        objective = self.objectives.get(name, Objective())
        return {"objective": objective.as_dict(), **summary(requests, met_count, self.window_s)}

    def by_class(self) -> dict[str, dict[str, Any]]:
        """Attainment per class (every class a service has), over the window."""
        now = self.clock()
        totals: dict[str, list[int]] = {}
        for name, cls in self.classes.items():
            requests, met_count = self._counts(name, now)
            entry = totals.setdefault(cls, [0, 0])
            entry[0] += requests
            entry[1] += met_count
        return {cls: summary(r, m, self.window_s) for cls, (r, m) in sorted(totals.items())}

    def _counts(self, name: str, now: float) -> tuple[int, int]:
        judged = self._judged.get(name)
        return judged.counts(now) if judged is not None else (0, 0)
