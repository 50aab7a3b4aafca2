"""Attributing an out-of-memory failure before anything is learned from it.

A load or a request that runs out of device memory says that the device had less room
than the service asked for, not that the service is larger than estimated. Three cases:

- **the service exceeded its own estimate** (``own_estimate``): it asked more than the
  ledger granted it. Only this case changes what the service is expected to need, and
  by what was measured: the bytes it asked when the shell measured them; else, when the
  device's use besides it was measured, at least the room it found (it asked more than
  that), and at least twice its grant; with nothing measured, twice its grant (a
  service twice as large as estimated costs one failure, not one per attempt). Never
  past what the device could ever hold (its usable memory);
- **the device was full** (``device_full``): it asked no more than it was granted, or the
  room left besides it was already smaller than its grant. Something else held the
  room the ledger gave it (a foreign program that grew, a service above its leases: the
  next memory sample tells which, and charges it); nothing is learned about the service;
- nothing distinguishes the two (``unmeasured``): the shell measured neither figure, so
  the service is assumed larger, as in the first case without a measurement.

What is learned from a bound or an assumption is not trusted for ever: the policy re-tests
it (``Learned.sizes``). What the service was measured to ask is a measurement, like a
finished load's: it is kept until a load measures the service again.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

#: Seconds a learned size is trusted before it is re-tested, doubling with each failure
#: attributed in a row, up to :data:`RETEST_MAX_S`.
RETEST_S = 300.0
RETEST_MAX_S = 3600.0


def retest_after(failures: int) -> float:
    """Seconds until a size learned after ``failures`` attributed failures in a row is
    re-tested."""
    return float(min(RETEST_MAX_S, RETEST_S * 2.0 ** max(0, failures - 1)))


class OomCause(StrEnum):
    """Why an out-of-memory failure happened, as far as the measurements tell."""

    OWN_ESTIMATE = "own_estimate"
    DEVICE_FULL = "device_full"
    UNMEASURED = "unmeasured"


@dataclass(frozen=True, slots=True)
class OomReport:
    """The attribution of one failure: its cause, the bytes the service is learned to need
    (None: nothing learned) and the evidence, in words."""

    cause: OomCause
    learned: int | None
    evidence: str
    #: What the service asked was measured: what it learned is a measurement, kept
    #: until a load measures the service again (a bound or an assumption is re-tested).
    measured: bool = False


def attribute(
    *,
    asked: int | None,
    granted: int,
    used_besides: int | None,
    capacity: int,
    ceiling: int,
) -> OomReport:
    """Attribute a failure of an allocation the ledger granted ``granted`` bytes for.

    ``asked``: what the allocation tried to hold (None: not measured); ``used_besides``:
    what the device held besides it when it failed (None: not measured); ``capacity``:
    the device's memory; ``ceiling``: the most the device could ever hold for it (what
    is learned never exceeds it)."""
    granted = max(0, granted)
    room = None if used_besides is None else max(0, capacity - used_besides)
    if asked is not None:
        if asked > granted:
            return OomReport(
                OomCause.OWN_ESTIMATE,
                min(ceiling, asked),
                f"asked {asked} B, granted {granted} B" + _room_words(room),
                measured=True,
            )
        return OomReport(
            OomCause.DEVICE_FULL,
            None,
            f"asked {asked} B within its grant of {granted} B" + _room_words(room),
        )
    if used_besides is not None:
        # the capacity left besides it, not clamped at zero: a device sampled past its
        # capacity is full even for a grant of nothing
        left = capacity - used_besides
        if left < granted:
            return OomReport(OomCause.DEVICE_FULL, None, f"granted {granted} B" + _room_words(room))
        return OomReport(
            OomCause.OWN_ESTIMATE,
            min(ceiling, max(left + 1, 2 * granted)),
            f"granted {granted} B, asked more than the {left} B left",
        )
    return OomReport(
        OomCause.UNMEASURED,
        min(ceiling, 2 * granted),
        f"granted {granted} B, nothing measured: assumed twice that",
    )


def _room_words(room: int | None) -> str:
    return "" if room is None else f", {room} B were left on the device besides it"
