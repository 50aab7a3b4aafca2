"""What a policy learned about its services from measurements and crashes, per service
name: kept in the World (``World.learned``) so that the snapshot shows it and the
explanations can name it, and changed only through the World's mutators.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class LearnedSize:
    """A resident size learned from an out-of-memory load attributed to the service
    itself (:mod:`accelmux.core.oom`): ``nbytes``, what it was learned from
    (``evidence``), when (``at``), and when it is re-tested (``retest_at``: from then
    on one load is admitted at the size measured before, ``testing``). ``failures``
    counts the attributed failures in a row: each doubles the wait for the re-test. A
    size measured (what the failing load asked) is not re-tested (``retest_at`` inf)."""

    nbytes: int
    evidence: str
    at: float
    retest_at: float
    failures: int = 1
    testing: bool = False

    def retest_words(self) -> str:
        """When it is re-tested, in words."""
        if self.testing:
            return "being re-tested"
        if math.isinf(self.retest_at):
            return "a measurement: kept until a load measures the service again"
        return f"re-tested at t={self.retest_at:.0f}"


@dataclass(slots=True)
class Learned:
    """Facts learned per service (by name) while the Manager runs; none survives a restart."""

    #: Services measured above what was accounted at the last sample: name -> the bytes
    #: measured above their leases, charged to them (``pressure_charging``).
    charged: dict[str, int] = field(default_factory=dict)
    #: Highest activation memory measured per loaded service: a caching allocator may
    #: keep that much reserved, so only a measurement above it shows an over-estimate.
    high_water: dict[str, int] = field(default_factory=dict)
    #: Largest projected activation of each realtime service's requests so far (what the
    #: realtime reserve keeps free per request), and how often one grew.
    realtime_peak: dict[str, int] = field(default_factory=dict)
    realtime_peak_changes: int = 0
    #: Crash count of each service when the policy last saw it.
    seen_crashes: dict[str, int] = field(default_factory=dict)
    #: Resident sizes learned from out-of-memory loads, until a load measures the
    #: service (or a re-test succeeds).
    sizes: dict[str, LearnedSize] = field(default_factory=dict)
    #: The attribution of each service's last out-of-memory load, in words.
    oom: dict[str, str] = field(default_factory=dict)

    def charge(self, name: str, nbytes: int) -> None:
        self.charged[name] = nbytes

    def clear_charge(self, name: str) -> bool:
        """Lift ``name``'s charge: whether it was charged."""
        return self.charged.pop(name, None) is not None

    def raise_high_water(self, name: str, measured: int) -> int:
        """Raise ``name``'s high water to ``measured``: the high water before (0: none)."""
        before = self.high_water.get(name, 0)
        self.high_water[name] = max(before, measured)
        return before

    def forget_activation(self, name: str) -> None:
        """``name`` holds no memory any more: its high water and charge go."""
        self.high_water.pop(name, None)
        self.charged.pop(name, None)

    def raise_realtime_peak(self, name: str, active: int) -> None:
        """The first activation seen for ``name`` sets its peak (even at 0), a larger one
        raises it; each change is counted in ``realtime_peak_changes``."""
        peak = self.realtime_peak.get(name)
        if peak is None or active > peak:
            self.realtime_peak[name] = max(0, active)
            self.realtime_peak_changes += 1

    def see_crashes(self, name: str, crashes: int) -> bool:
        """Note ``name``'s crash count: whether it changed since last seen."""
        if crashes == self.seen_crashes.get(name, 0):
            return False
        self.seen_crashes[name] = crashes
        return True
