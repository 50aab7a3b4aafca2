"""What the job store hands out: frozen records, never live rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

JobStatus = Literal["queued", "running", "paused", "completed", "cancelled", "failed"]
InputState = Literal["pending", "leased", "done", "failed", "cancelled"]

#: Job statuses in which inputs may still start.
ACTIVE_STATUSES: tuple[JobStatus, ...] = ("queued", "running", "paused")
#: Job statuses that never change again.
FINISHED_STATUSES: tuple[JobStatus, ...] = ("completed", "cancelled", "failed")
INPUT_STATES: tuple[InputState, ...] = ("pending", "leased", "done", "failed", "cancelled")


@dataclass(frozen=True, slots=True, kw_only=True)
class JobCounts:
    """How many inputs of a job are in each state; they always add up to ``total``."""

    total: int
    pending: int = 0
    leased: int = 0
    done: int = 0
    failed: int = 0
    cancelled: int = 0

    @property
    def finished(self) -> int:
        return self.done + self.failed + self.cancelled


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    id: str
    model: str
    status: JobStatus
    created_at: float
    started_at: float | None
    finished_at: float | None
    max_attempts: int
    counts: JobCounts
    metadata: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    #: SHA-256 (hex) of the API key that submitted it; None: submitted without keys
    #: configured, or stored before jobs had owners.
    owner: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Viewer:
    """Who asks for jobs: ``owner`` is the SHA-256 (hex) of their key; with ``sees_all``
    (the admin key, or no API keys configured) every job is theirs to see."""

    owner: str | None = None
    sees_all: bool = False


#: Every job (the admin key, or a daemon without API keys).
EVERYONE = Viewer(sees_all=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class LeasedInput:
    index: int
    text: str
    attempt: int  # 1 for the first try


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    """Inputs of one job handed to one runner task; ``token`` proves who holds them."""

    job_id: str
    model: str
    token: str
    inputs: tuple[LeasedInput, ...]

    @property
    def indexes(self) -> list[int]:
        return [item.index for item in self.inputs]


@dataclass(frozen=True, slots=True, kw_only=True)
class ResultItem:
    """One input's outcome: ``result`` when done, ``error`` when failed."""

    index: int
    state: InputState
    attempts: int
    result: Any = None
    error: str | None = None
