"""Per-service live generation figures the gateway measures: time to first token (TTFT),
time between tokens (TBT) and the context the latest request used.

The same for every backend (the inference worker, an external server, the fake): the
gateway times each streamed answer it relays. TTFT is from the request's arrival at
the gateway (queueing and a cold start included: what a client waits) to the first
stream chunk; TBT is the gap between two chunks (a chunk is one token for the worker,
llama-server and vLLM; a server that sends several per chunk shows longer gaps).
Figures are the p50 and p95 over a sliding window of the last :data:`WINDOW_S` seconds
(at most :data:`MAX_SAMPLES` per series, the oldest dropped first), nearest-rank
percentiles; none when the window holds no sample. Non-streamed answers have no TTFT
or TBT.

Context in use: ``prompt_tokens + completion_tokens`` of the service's latest answer
that reported usage (a non-streamed answer, or a stream with
``stream_options.include_usage``). A server that reports its own (llama-server's
``/slots``) is preferred by :func:`accelmux.runtime.status.service_usage`.
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from accelmux.runtime import live_slo

#: The sliding window of the percentiles, seconds.
WINDOW_S = 300.0
#: Samples kept per series and service (the oldest go first).
MAX_SAMPLES = 4096


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..1) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


@dataclass(slots=True)
class Series:
    """Timed samples of one figure, kept for the window."""

    window_s: float = WINDOW_S
    samples: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))

    def add(self, now: float, value: float) -> None:
        self.samples.append((now, value))

    def values(self, now: float) -> list[float]:
        while self.samples and self.samples[0][0] < now - self.window_s:
            self.samples.popleft()
        return [v for _, v in self.samples]

    def summary(self, now: float) -> dict[str, float | int | None]:
        values = self.values(now)
        if not values:
            return {"p50": None, "p95": None, "count": 0}
        return {
            "p50": round(percentile(values, 0.5), 6),
            "p95": round(percentile(values, 0.95), 6),
            "count": len(values),
        }


class StreamTimer:
    """Times one relayed stream: call :meth:`chunk` for each chunk that goes out."""

    __slots__ = ("_last", "_live", "_service", "_started")

    def __init__(self, live: LiveLatency, service: str, started: float) -> None:
        self._live = live
        self._service = service
        self._started = started
        self._last: float | None = None

    def chunk(self, data: bytes) -> None:
        now = self._live.clock()
        timing = live_slo.CURRENT.get()  # the request's own, judged against its objectives
        if timing is not None:
            timing.chunk(now)
        if self._last is None:
            self._live.series(self._service, "ttft").add(now, now - self._started)
        else:
            self._live.series(self._service, "tbt").add(now, now - self._last)
        self._last = now
        if b'"usage"' in data:
            for line in data.split(b"\n"):
                if line.startswith(b"data:") and b'"usage"' in line:
                    self._live.usage_json(self._service, line[5:])


class LiveLatency:
    """TTFT, TBT and context in use per service (see the module's docstring)."""

    def __init__(
        self, *, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window_s = window_s
        self.clock = clock
        self._series: dict[tuple[str, str], Series] = {}
        self._context: dict[str, int] = {}

    def series(self, service: str, name: str) -> Series:
        key = (service, name)
        found = self._series.get(key)
        if found is None:
            found = self._series[key] = Series(window_s=self.window_s)
        return found

    def stream(self, service: str, started: float) -> StreamTimer:
        """A timer for one stream of ``service`` whose request arrived at ``started``
        (on :attr:`clock`)."""
        return StreamTimer(self, service, started)

    def usage_json(self, service: str, raw: bytes) -> None:
        """Note the usage of an answer (an OpenAI JSON body or stream chunk), if any."""
        try:
            obj: Any = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return
        usage = obj.get("usage") if isinstance(obj, dict) else None
        if not isinstance(usage, dict):
            return
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(prompt, int) and isinstance(completion, int):
            self._context[service] = prompt + completion

    def figures(self, service: str) -> dict[str, Any]:
        """``ttft_s`` and ``tbt_s`` (p50, p95, count over the window) and
        ``context_in_use_tokens`` (the latest answer's; None before one)."""
        now = self.clock()
        return {
            "window_s": self.window_s,
            "ttft_s": self.series(service, "ttft").summary(now),
            "tbt_s": self.series(service, "tbt").summary(now),
            "context_in_use_tokens": self._context.get(service),
        }
