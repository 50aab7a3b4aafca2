"""Recorded requests and device timelines: the files ``accelmux history export`` writes.

A **request trace** (CSV, one request a row, in arrival order) is what a daemon served:
what each request asked (service, sizes), what it turned out to need (the tokens it
produced, its measured memory peak) and, for a request that a client sent as soon as an
earlier one of the same client ended (the next step of a voice chain, a job's next
batch), that link: ``after`` (the earlier row's ``index``) and ``gap_s`` (how long after
its end this one came). The ``recorded`` workload replays it: a row without a link at
its recorded time, a linked row ``gap_s`` after its predecessor ends in the simulation,
so a faster or slower device moves the chain as it would move the real client.
The measured columns (``queue_s`` .. ``first_wait``) are what the real daemon gave;
the simulator does not read them (a plan compares its replay with them).

A **device timeline** (CSV) is what the daemon measured of each device that it does not
manage: ``other_bytes``, the memory in use that is not the services' (the OS, other
programs, accelmux itself), ``baseline_bytes``, the part of it the daemon counted as the
device's own (the OS share outside the budget, accelmux's process: not foreign), and
``foreign_compute``, the fraction of the device's compute other processes used (on a
host: the cores busy outside the managed processes). The simulator replays it as a
process of ``other_bytes`` with that baseline, so its Manager sees the foreign memory the
daemon saw, and as a foreign compute share.

Both files start with a ``# accelmux ... format N`` line; a file of another format, a
missing column or a malformed row is an error that names the file, line and column.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

from accelmux.errors import AccelmuxError

TRACE_FORMAT = 1
TIMELINE_FORMAT = 1
TRACE_MAGIC = f"# accelmux request trace, format {TRACE_FORMAT}"
TIMELINE_MAGIC = f"# accelmux device timeline, format {TIMELINE_FORMAT}"


class RecordedError(AccelmuxError):
    """A request trace or device timeline that cannot be read."""


@dataclass(frozen=True, slots=True)
class TraceRow:
    index: int
    arrival_s: float
    service: str
    stream: bool = False
    pausable: bool = False
    prompt_tokens: int = 0
    max_output_tokens: int = 0
    kv_tokens: int = 0
    units: float = 0.0
    output_tokens: int | None = None
    peak_bytes: int | None = None
    after: int | None = None
    gap_s: float | None = None
    # measured by the daemon (not read by the simulator)
    origin: str = "http"
    queue_s: float | None = None
    response_s: float | None = None
    total_s: float | None = None
    outcome: str = ""
    reason: str = ""
    first_wait: str = ""


@dataclass(frozen=True, slots=True)
class TimelineRow:
    t_s: float
    device: str
    other_bytes: int
    baseline_bytes: int | None = None
    foreign_compute: float | None = None


_REQUIRED_TRACE = ("index", "arrival_s", "service")
_REQUIRED_TIMELINE = ("t_s", "device", "other_bytes")


def _names(row_type: type[Any]) -> list[str]:
    return [f.name for f in fields(row_type)]


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e15 else str(int(value))
    return str(value)


def _write(path: Path, magic: str, rows: Iterable[Any], row_type: type[Any]) -> None:
    buf = io.StringIO()
    buf.write(magic + "\n")
    writer = csv.writer(buf, lineterminator="\n")
    names = _names(row_type)
    writer.writerow(names)
    for row in rows:
        writer.writerow([_cell(getattr(row, n)) for n in names])
    path.write_text(buf.getvalue(), encoding="utf-8")


def write_trace(path: Path, rows: Iterable[TraceRow]) -> None:
    _write(path, TRACE_MAGIC, rows, TraceRow)


def write_timeline(path: Path, rows: Iterable[TimelineRow]) -> None:
    _write(path, TIMELINE_MAGIC, rows, TimelineRow)


def _convert(kind: str, text: str) -> Any:
    if kind == "bool":
        if text not in ("0", "1", "true", "false"):
            raise ValueError(f"expected 0 or 1, got {text!r}")
        return text in ("1", "true")
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    return text


def _parse_field(row_type: type[Any], name: str, text: str) -> Any:
    annotation = str(row_type.__annotations__[name])
    optional = "None" in annotation
    if text == "":
        if optional:
            return None
        if annotation == "str":
            return ""
        raise ValueError("empty")
    return _convert(annotation.split("|", maxsplit=1)[0].strip(), text)


def _read(path: Path, magic: str, row_type: type[Any], required: Sequence[str]) -> list[Any]:
    what = "request trace" if row_type is TraceRow else "device timeline"
    if not path.is_file():
        raise RecordedError(f"{what} not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordedError(f"{path}: cannot read the {what} ({exc})") from None
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# accelmux"):
        raise RecordedError(f"{path}: not an accelmux {what} (its first line must be {magic!r})")
    if lines[0].strip() != magic:
        raise RecordedError(
            f"{path}: {lines[0].strip()[2:]!s}, this accelmux reads {magic[2:]!s}; "
            "export it again with this version"
        )
    reader = csv.reader(lines[1:])
    header = next(reader, None)
    if header is None:
        raise RecordedError(f"{path}: no header line (truncated?)")
    missing = [c for c in required if c not in header]
    if missing:
        raise RecordedError(f"{path}: missing column(s) {', '.join(missing)}")
    known = set(_names(row_type))
    out = []
    for lineno, values in enumerate(reader, start=3):
        if not values:
            continue
        if len(values) != len(header):
            raise RecordedError(
                f"{path}, line {lineno}: {len(values)} values for {len(header)} columns "
                "(a truncated or edited file?)"
            )
        kwargs: dict[str, Any] = {}
        for name, value in zip(header, values, strict=True):
            if name not in known:
                continue
            try:
                kwargs[name] = _parse_field(row_type, name, value.strip())
            except ValueError as exc:
                raise RecordedError(f"{path}, line {lineno}, column {name}: {exc}") from None
        out.append(row_type(**kwargs))
    return out


@lru_cache(maxsize=8)
def _cached_trace(path: str, mtime: float) -> tuple[TraceRow, ...]:
    del mtime  # part of the cache key only: an edited file is read again
    rows: list[TraceRow] = _read(Path(path), TRACE_MAGIC, TraceRow, _REQUIRED_TRACE)
    seen: set[int] = set()
    for row in rows:
        if row.index in seen:
            raise RecordedError(f"{path}: index {row.index} appears twice")
        if row.after is not None and row.after not in seen:
            raise RecordedError(
                f"{path}: row {row.index} follows row {row.after}, which does not come before it"
            )
        if row.arrival_s < 0:
            raise RecordedError(f"{path}: row {row.index} arrives before 0 ({row.arrival_s})")
        seen.add(row.index)
    return tuple(rows)


def read_trace(path: Path) -> tuple[TraceRow, ...]:
    """The rows of a request trace (cached while the file is unchanged)."""
    try:
        mtime = path.stat().st_mtime
    except OSError:
        mtime = 0.0
    return _cached_trace(str(path), mtime)


def read_timeline(path: Path) -> list[TimelineRow]:
    rows: list[TimelineRow] = _read(path, TIMELINE_MAGIC, TimelineRow, _REQUIRED_TIMELINE)
    return sorted(rows, key=lambda r: r.t_s)
