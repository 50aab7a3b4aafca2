"""The rows of the request history: what one request, load, decision or sample leaves.

Times are seconds on the run's clock (the daemon's Manager clock, which starts at 0
when the daemon starts); a :class:`DaemonRun` row says which wall-clock instant that 0 is,
so the local time of day of every row is known (maintenance windows depend on it).

Nothing here holds a prompt, an output, a file name a client sent, or an API key: a
request is its service, its sizes, its times and its outcome. The ``config`` a run
keeps is the daemon's config without its ``server`` section (keys, addresses) and
without the services' ``backend`` sections (commands, environments, camera URLs).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

#: The version of the format these rows are written in (``PRAGMA user_version``).
HISTORY_FORMAT = 1


@dataclass(slots=True)
class DaemonRun:
    """One run of the daemon: when its clock started and what it ran."""

    TABLE: ClassVar[str] = "runs"

    run: str
    started_wall: float
    version: str
    config: str  # JSON: devices, services (without backends), policy
    spec: str  # JSON: each device's capacity and budget and each service's capabilities


@dataclass(slots=True)
class RequestRecord:
    """One request, from its arrival to its end.

    ``outcome``: ``ok``, ``rejected`` (never ran), ``failed`` (cut off by the Manager:
    a crash, a shutdown), ``error`` (its backend answered with an error), ``cancelled``
    (the client went away) or ``open`` (the daemon stopped first). ``reason`` is the
    Manager's reason for a rejection or a failure. ``first_wait`` is the reason it was
    first told to wait (None: dispatched at once). ``origin`` is ``http``, ``job`` or
    ``camera`` (from the daemon's request id).
    """

    TABLE: ClassVar[str] = "requests"

    run: str
    request_id: str
    service: str
    replica: str
    cls: str
    kind: str
    origin: str
    t_arrived: float
    prompt_tokens: int = 0
    max_output_tokens: int = 0
    kv_tokens: int = 0
    units: float = 0.0
    pausable: int = 0
    stream: int = 0
    t_dispatched: float | None = None
    t_first_token: float | None = None
    t_finished: float | None = None
    output_tokens: int | None = None
    outcome: str = "open"
    reason: str | None = None
    first_wait: str | None = None
    attempts: int = 0
    preemptions: int = 0
    pauses: int = 0
    peak_bytes: int | None = None


@dataclass(slots=True)
class LoadRecord:
    """One load of a service: asked at ``t_start``, done (or failed) at ``t_end``.

    ``weights`` and ``runtime`` are the bytes the backend measured (0 for a service that
    shares a copy another loaded); ``shared`` when it did."""

    TABLE: ClassVar[str] = "loads"

    run: str
    service: str
    t_start: float
    from_tier: str
    kv_pool: int
    reason: str
    t_end: float | None = None
    ok: int = 0
    weights: int | None = None
    runtime: int | None = None
    error: str | None = None


@dataclass(slots=True)
class DecisionRecord:
    """A decision that is not a request's own dispatch or wait: a load, an unload (with
    its reason: an eviction, a TTL, a window), a resize, a pause, a resume, a preemption,
    a rejection or a failure."""

    TABLE: ClassVar[str] = "decisions"

    run: str
    t: float
    action: str
    service: str
    reason: str
    request_id: str | None = None


@dataclass(slots=True)
class SampleRecord:
    """One memory sample of a device, and the compute used since the one before.

    ``per_service`` is JSON (bytes measured per service). ``cpu_managed`` and
    ``cpu_total`` are fractions of the host's cores busy since the previous sample: in
    the managed services' processes, and in every process of the machine;
    ``run_managed`` and ``run_total`` the mean number of their threads that could run
    (:mod:`accelmux.history.cpu`). None on a device that is not the host, and for the
    first sample."""

    TABLE: ClassVar[str] = "samples"

    run: str
    t: float
    device: str
    used: int
    managed: int
    baseline: int
    overhead: int
    per_service: str
    cpu_managed: float | None = None
    cpu_total: float | None = None
    run_managed: float | None = None
    run_total: float | None = None
    #: The runnable-thread counts of the span, with their times (``history.cpu``).
    ticks: str | None = None


ROW_TYPES: tuple[type[Any], ...] = (
    DaemonRun,
    RequestRecord,
    LoadRecord,
    DecisionRecord,
    SampleRecord,
)


def columns(row_type: type[Any]) -> list[str]:
    """The columns of a row type, in order (its dataclass fields)."""
    return [f.name for f in dataclasses.fields(row_type)]


def as_tuple(row: Any) -> tuple[Any, ...]:
    return tuple(getattr(row, name) for name in columns(type(row)))
