"""Memory estimates and their calibration from observed peaks.

An estimate comes from the static profile (for LLMs, from GGUF metadata at config
time). Each finished request reports its observed peak; the calibrator keeps the recent
ratios observed/estimated and projects the next request's peak as
``estimate x max(safety_factor, worst recent ratio x margin)``. Load sizes are
calibrated the same way from what the monitors measured after a load.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from accelmux.core.events import Demand
from accelmux.core.specs import MemoryProfile

#: Margin applied above the worst recent observed ratio.
RATIO_MARGIN = 1.05


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestEstimate:
    """Raw (uncalibrated) memory of one request: KV drawn from the pool, active from the device."""

    kv_bytes: int
    active_bytes: int

    @property
    def total(self) -> int:
        return self.kv_bytes + self.active_bytes


def estimate_request(profile: MemoryProfile, demand: Demand) -> RequestEstimate:
    kv = profile.kv_bytes_per_token * demand.kv_tokens
    active = profile.workspace + math.ceil(profile.per_unit * demand.units)
    return RequestEstimate(kv_bytes=kv, active_bytes=active)


class RatioCalibrator:
    """Keeps the last N observed/estimated ratios; projects with a safety factor."""

    __slots__ = ("_peak", "_ratios", "safety_factor", "version")

    def __init__(self, *, window: int, safety_factor: float) -> None:
        self._ratios: deque[float] = deque(maxlen=window)
        self.safety_factor = safety_factor
        #: ``max(self._ratios)`` while no ratio was added since (None: to recompute).
        self._peak: float | None = None
        #: Bumped by every ratio added: equal versions, equal projections.
        self.version = 0

    def _worst_ratio(self) -> float:
        """The largest ratio kept (there is one): projections read it on every decision."""
        if self._peak is None:
            self._peak = max(self._ratios)
        return self._peak

    @property
    def observations(self) -> int:
        return len(self._ratios)

    def observe(self, estimated: int, observed: int) -> None:
        if estimated <= 0 or observed < 0:
            return
        self._ratios.append(observed / estimated)
        self._peak = None
        self.version += 1

    @property
    def factor(self) -> float:
        """The multiplier applied to the next estimate (>= 1)."""
        if not self._ratios:
            return self.safety_factor
        worst = self._worst_ratio() * RATIO_MARGIN
        # Enough evidence lets the factor fall below the cold-start safety factor,
        # but never below the worst ratio recently seen.
        if len(self._ratios) >= 8:
            return max(1.0, worst)
        return max(self.safety_factor, worst)

    def project(self, estimated: int) -> int:
        return math.ceil(estimated * self.factor)

    def observe_ratio(self, ratio: float) -> None:
        """Record an observed/estimated ratio directly (a failure's lower bound)."""
        if ratio > 0:
            self._ratios.append(ratio)
            self._peak = None
            self.version += 1

    @property
    def worst(self) -> float:
        """The worst observed/estimated ratio kept, without margin (1.0 before any)."""
        return max(1.0, self._worst_ratio()) if self._ratios else 1.0

    def project_observed(self, estimated: int) -> int:
        """The estimate scaled by what was observed alone (no safety factor, no margin)."""
        return math.ceil(estimated * self.worst)


class ServiceCalibration:
    """Calibration state of one service: per-request active memory, and load size."""

    __slots__ = ("active", "learn", "resident", "resident_floor")

    def __init__(self, *, window: int, safety_factor: float, learn: bool = True) -> None:
        self.active = RatioCalibrator(window=window, safety_factor=safety_factor)
        self.resident = RatioCalibrator(window=8, safety_factor=1.0)
        #: False: observations are ignored (estimates x safety factor only; ablation).
        self.learn = learn
        #: A resident size learned from an out-of-memory load (0: none): loads are
        #: projected at least this large until it is lifted (``set_resident_floor``).
        self.resident_floor = 0

    def set_resident_floor(self, nbytes: int) -> None:
        """Project loads at least ``nbytes`` large (0: lift the floor)."""
        if nbytes != self.resident_floor:
            self.resident_floor = nbytes
            self.resident.version += 1

    def project_active(self, estimate: RequestEstimate) -> int:
        return self.active.project(estimate.active_bytes)

    def observe_request(self, estimate: RequestEstimate, peak_bytes: int) -> None:
        if not self.learn:
            return
        observed_active = max(0, peak_bytes - estimate.kv_bytes)
        self.active.observe(estimate.active_bytes, observed_active)

    def observe_failure(self, estimated_active: int, lease_bytes: int) -> None:
        """A request crashed its service (an OOM or a crash) while holding ``lease_bytes``.

        What it really needed is unknown but more than it was given: the next projection
        is at least twice the lease, so a service that is twice as large as estimated
        costs one crash, not one per request.
        """
        if not self.learn or estimated_active <= 0:
            return
        self.active.observe(estimated_active, math.ceil(2 * lease_bytes / RATIO_MARGIN))

    def observe_excess(self, estimated_active: int, measured_active: int) -> None:
        """Measured activation memory of running requests, when above what was projected."""
        if not self.learn or estimated_active <= 0:
            return
        if measured_active > estimated_active * self.active.worst:
            self.active.observe(estimated_active, measured_active)

    def observe_load_failure(self, estimated_resident: int, learned_resident: int) -> None:
        """A load was attributed an out-of-memory failure of its own and learned to need
        ``learned_resident`` (its resident size, see ``set_resident_floor``).

        Requests of a service never measured yet are projected larger too, by the same
        ratio (a model larger than estimated has larger activations), so a service whose
        load and requests are both misestimated costs one OOM, not one for each.
        """
        if not self.learn or estimated_resident <= 0 or self.active.observations:
            return
        ratio = max(1.0, learned_resident / estimated_resident)
        self.active.observe_ratio(ratio * self.active.safety_factor / RATIO_MARGIN)

    def observe_load(self, estimated_resident: int, measured_resident: int) -> None:
        if not self.learn:
            return
        self.resident.observe(estimated_resident, measured_resident)

    def project_resident(self, estimated_resident: int) -> int:
        if self.resident.observations == 0:
            return max(estimated_resident, self.resident_floor)
        return max(self.resident.project(estimated_resident), self.resident_floor)

    def observe_request_failure(self, estimated_active: int, asked_active: int) -> None:
        """A request of this service ran out of memory asking ``asked_active`` bytes of
        activations, more than it was granted (attributed to its own estimate)."""
        if not self.learn or estimated_active <= 0:
            return
        self.active.observe(estimated_active, asked_active)
