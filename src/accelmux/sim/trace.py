"""Replay of the Azure LLM inference trace 2023 (conversation part), scaled to home rates.

The CSV (columns TIMESTAMP, ContextTokens, GeneratedTokens) is read from where the
scenario points (by default the copy shipped in ``accelmux/sim/traces/``, with its
CC-BY attribution beside it) or from ``--trace PATH``. A home server sees far fewer
requests than Azure. A run of ``duration_s`` at ``rate_per_s`` replays
``n = round(rate_per_s x duration_s)`` consecutive rows from a random starting row (one
per seed; wrapping past the end), and stretches that stretch of the trace so that it
spans the run exactly. The run thus holds the expected count whatever stretch the seed
picks (a stretch that falls inside a burst is slowed down, a quiet one sped up), and
keeps the order, the relative gaps (the burstiness inside the stretch) and the token mix
of the trace.
"""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path

from accelmux.errors import AccelmuxError


class TraceError(AccelmuxError):
    """The trace file is missing or not in the expected format."""


@dataclass(frozen=True, slots=True)
class TraceRow:
    offset_s: float
    context_tokens: int
    generated_tokens: int


@dataclass(frozen=True, slots=True)
class Trace:
    rows: tuple[TraceRow, ...]

    @property
    def span_s(self) -> float:
        return self.rows[-1].offset_s - self.rows[0].offset_s

    @property
    def rate_per_s(self) -> float:
        return (len(self.rows) - 1) / self.span_s if self.span_s > 0 else 0.0


def _parse_time(text: str) -> float:
    text = text.strip()
    if "." in text:
        head, frac = text.split(".", 1)
        text = f"{head}.{frac[:6]}"
    return datetime.fromisoformat(text).timestamp()


@lru_cache(maxsize=4)
def load_trace(path: str) -> Trace:
    p = Path(path)
    if not p.is_file():
        raise TraceError(
            f"trace not found: {p} (a CSV with columns TIMESTAMP, ContextTokens, "
            "GeneratedTokens; pass --trace PATH, or leave the workload's path out to use "
            "the Azure trace shipped with accelmux)"
        )
    rows: list[TraceRow] = []
    try:
        with p.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            need = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
            if reader.fieldnames is None or not need <= set(reader.fieldnames):
                raise TraceError(f"{p}: expected columns {sorted(need)}, got {reader.fieldnames}")
            t0: float | None = None
            for line in reader:
                t = _parse_time(line["TIMESTAMP"])
                t0 = t if t0 is None else t0
                rows.append(
                    TraceRow(
                        offset_s=t - t0,
                        context_tokens=int(line["ContextTokens"]),
                        generated_tokens=int(line["GeneratedTokens"]),
                    )
                )
    except (ValueError, KeyError) as exc:
        raise TraceError(f"{p}: malformed row ({exc})") from None
    if len(rows) < 2:
        raise TraceError(f"{p}: needs at least two rows")
    rows.sort(key=lambda r: r.offset_s)
    return Trace(rows=tuple(rows))


def scaled_arrivals(
    trace: Trace,
    *,
    rate_per_s: float,
    duration_s: float,
    rng: random.Random,
) -> list[tuple[float, TraceRow]]:
    """Arrivals over ``duration_s`` at a mean ``rate_per_s``: (time, row) pairs.

    ``round(rate_per_s x duration_s)`` rows from a random start, stretched to the run.
    """
    count = round(rate_per_s * duration_s)
    if count <= 0 or duration_s <= 0:
        return []
    rows = trace.rows
    n = len(rows)
    mean_gap = 1.0 / trace.rate_per_s if trace.rate_per_s > 0 else 1.0
    i = rng.randrange(n)
    # Offsets of rows i+1 .. i+count (and of the one after, which closes the stretch) from
    # row i, in trace seconds; a wrap past the last row adds one mean gap.
    offsets: list[float] = []
    t = 0.0
    picked: list[TraceRow] = []
    for _ in range(count + 1):
        j = (i + 1) % n
        gap = rows[j].offset_s - rows[i].offset_s if j > i else mean_gap
        t += max(0.0, gap)
        offsets.append(t)
        picked.append(rows[j])
        i = j
    span = offsets[-1]
    if span <= 0:
        return [(duration_s * k / (count + 1), picked[k]) for k in range(count)]
    scale = duration_s / span
    return [(offsets[k] * scale, picked[k]) for k in range(count)]
