"""The physical device: true memory, allocator caches, foreign processes and OOMs.

What the simulator believes is *true*, as opposed to what the Manager estimates:

- a loaded service holds its true resident bytes (weights and runtime drawn around the
  estimate) plus its KV pool (an explicit allocation, exact);
- a running request holds its true activation peak from start to end (estimate x a
  random factor drawn by the workload);
- a service flagged ``caching_allocator`` keeps freed activation memory reserved up to
  its high-water mark (PyTorch's caching allocator) until it unloads or crashes;
- foreign processes hold bytes the Manager does not control.

An allocation that would cross the capacity is an **OOM**: it does not happen, and
the caller crashes the service that asked (its in-flight requests fail, its memory is
freed). The oracle's device has infinite capacity.

A foreign process takes all it asks for when it starts, whatever the services hold (a
game allocates regardless): the device is then **over-committed** (``used`` above the
capacity), every managed allocation OOMs until the services free enough, and the foreign
process is *short* of the excess meanwhile (the last one to start first). One started
``free_only`` takes only what is free and is short of the rest for its whole life.
Each process's life is kept as a :class:`ForeignProcess` (bytes short over time, and
when it first held everything it asked) for :mod:`accelmux.sim.metrics`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(slots=True)
class ServiceMemory:
    resident: int
    kv_pool: int
    caching: bool
    active: dict[str, int] = field(default_factory=dict)
    active_total: int = 0
    cache: int = 0

    @property
    def activation(self) -> int:
        return max(self.active_total, self.cache) if self.caching else self.active_total

    @property
    def total(self) -> int:
        return self.resident + self.kv_pool + self.activation

    @property
    def reserved(self) -> int:
        """Cached but unused activation memory."""
        return self.activation - self.active_total


@dataclass(slots=True)
class OomEvent:
    time: float
    device: str
    service: str
    what: str  # "load" | "request" | "resize"
    asked: int
    used: int
    capacity: float
    #: Foreign bytes that appeared since the last memory sample the Manager was sent.
    unseen_foreign: int = 0

    @property
    def foreign_surge(self) -> bool:
        """The allocation would have fit but for foreign memory no sample had shown yet:
        a process outside accelmux took it between two samples, and no policy could have
        seen it coming (counted apart from the OOMs a policy causes)."""
        return self.unseen_foreign > 0 and self.used - self.unseen_foreign + self.asked <= (
            self.capacity
        )


@dataclass(slots=True)
class ForeignProcess:
    """One foreign process's life on a device: what it asked and what it went without."""

    key: str
    device: str
    asked: int
    free_only: bool
    started_at: float
    ended_at: float | None = None
    #: Bytes it asked for and does not hold now.
    short: int = 0
    #: Integrals over its life so far (byte-seconds): short of, and asked for.
    short_byte_s: float = 0.0
    asked_byte_s: float = 0.0
    #: When it first held everything it asked (None: never yet).
    whole_at: float | None = None

    def wait_s(self, end: float) -> float:
        """Seconds from its start until it held all it asked (its whole life, up to
        ``end`` when it is still running, if it never did)."""
        if self.whole_at is not None:
            return self.whole_at - self.started_at
        stop = self.ended_at if self.ended_at is not None else end
        return max(0.0, stop - self.started_at)


class PhysicalDevice:
    """True memory of one device.

    ``clock`` gives the virtual time, so that foreign processes' shortfalls are
    integrated over time (a device without one lives at t = 0).
    """

    def __init__(
        self, name: str, capacity: float, *, clock: Callable[[], float] | None = None
    ) -> None:
        self.name = name
        self.capacity = capacity
        self.services: dict[str, ServiceMemory] = {}
        #: Bytes each foreign process counts in ``used`` (all it asked, unless free-only).
        self.foreign: dict[str, int] = {}
        #: Foreign bytes as the last memory sample showed them to the Manager.
        self.foreign_seen = 0
        self.used = 0
        self.peak_used = 0
        self._clock = clock or (lambda: 0.0)
        self._last_t = 0.0
        #: Foreign processes running now (in start order) and every one there was.
        self._live: dict[str, ForeignProcess] = {}
        self.processes: list[ForeignProcess] = []

    @property
    def over_committed(self) -> int:
        """Bytes the device is asked to hold beyond its capacity (0 when it fits)."""
        if not math.isfinite(self.capacity):
            return 0
        return max(0, int(self.used - self.capacity))

    def advance(self, now: float | None = None) -> None:
        """Integrate the foreign processes' shortfalls up to ``now`` (default: the clock)."""
        t = self._clock() if now is None else now
        dt = t - self._last_t
        if dt > 0:
            for proc in self._live.values():
                proc.short_byte_s += proc.short * dt
                proc.asked_byte_s += proc.asked * dt
        self._last_t = max(self._last_t, t)

    def _recount(self) -> None:
        """Who is short of what after a change: the excess of an over-committed device
        falls on the foreign processes that took memory regardless, last started first."""
        if not self._live:
            return
        excess = self.over_committed
        for proc in reversed(self._live.values()):
            if proc.free_only:
                proc.short = proc.asked - self.foreign.get(proc.key, 0)
            else:
                proc.short = min(excess, proc.asked)
                excess -= proc.short
            if proc.short == 0 and proc.whole_at is None:
                proc.whole_at = self._last_t

    @property
    def foreign_total(self) -> int:
        return sum(self.foreign.values())

    @property
    def unseen_foreign(self) -> int:
        """Foreign bytes that appeared since the last sample (0 when they shrank)."""
        return max(0, self.foreign_total - self.foreign_seen)

    def _fits(self, delta: int) -> bool:
        return self.used + delta <= self.capacity

    def _commit(self, delta: int) -> None:
        self.used += delta
        self.peak_used = max(self.peak_used, self.used)

    def load(self, service: str, resident: int, kv_pool: int, caching: bool) -> bool:
        """Allocate a service's resident memory; False is an OOM (nothing allocated)."""
        if service in self.services:
            self.free(service)
        need = resident + kv_pool
        if not self._fits(need):
            return False
        self.services[service] = ServiceMemory(resident=resident, kv_pool=kv_pool, caching=caching)
        self._commit(need)
        return True

    def _freed(self, delta: int) -> None:
        """``used`` falls by ``delta``: the foreign processes short of memory get it."""
        if self._live and delta > 0:
            self.advance()
        self.used -= delta
        if self._live and delta > 0:
            self._recount()

    def free(self, service: str) -> int:
        """Release everything a service holds (unload or crash); returns the bytes freed."""
        mem = self.services.pop(service, None)
        if mem is None:
            return 0
        total = mem.total
        self._freed(total)
        return total

    def hand_over(self, giver: str, taker: str, nbytes: int) -> None:
        """``nbytes`` of ``giver``'s resident memory become ``taker``'s (a shared copy of
        weights that stays loaded for the service that still uses it); ``used`` is
        unchanged."""
        src, dst = self.services.get(giver), self.services.get(taker)
        if src is None or dst is None:
            return
        moved = min(nbytes, src.resident)
        src.resident -= moved
        dst.resident += moved

    def start_request(self, service: str, rid: str, nbytes: int) -> bool:
        """Allocate a request's activation peak; False is an OOM (nothing allocated)."""
        mem = self.services[service]
        before = mem.activation
        mem.active_total += nbytes
        delta = mem.activation - before
        if not self._fits(delta):
            mem.active_total -= nbytes
            return False
        mem.active[rid] = nbytes
        self._commit(delta)
        return True

    def end_request(self, service: str, rid: str) -> None:
        mem = self.services.get(service)
        if mem is None:
            return
        nbytes = mem.active.pop(rid, None)
        if nbytes is None:
            return
        before = mem.activation
        if mem.caching:
            mem.cache = max(mem.cache, mem.active_total)
        mem.active_total -= nbytes
        self._freed(before - mem.activation)

    def kv_pool(self, service: str) -> int:
        mem = self.services.get(service)
        return mem.kv_pool if mem is not None else 0

    def resize(self, service: str, kv_pool: int) -> bool:
        mem = self.services.get(service)
        if mem is None:
            return True
        delta = kv_pool - mem.kv_pool
        if delta > 0 and not self._fits(delta):
            return False
        mem.kv_pool = kv_pool
        if delta < 0:
            self._freed(-delta)
        else:
            self._commit(delta)
        return True

    def set_foreign(self, name: str, nbytes: int, *, free_only: bool = False) -> int:
        """Set a foreign process's usage (0: it ended) and return the bytes it holds now.

        It takes all ``nbytes`` whatever the device holds, over-committing it; with
        ``free_only`` it takes only what is free and never asks again.
        """
        self.advance()
        current = self.foreign.get(name, 0)
        if free_only:
            room = self.capacity - (self.used - current)
            counted = int(min(nbytes, room)) if math.isfinite(room) else nbytes
            counted = max(0, counted)
        else:
            counted = nbytes
        self.foreign[name] = counted
        self.used += counted - current
        self.peak_used = max(self.peak_used, self.used)
        proc = self._live.get(name)
        if nbytes <= 0:
            if proc is not None:
                proc.ended_at = self._last_t
                proc.short = 0
                del self._live[name]
        elif proc is None:
            proc = ForeignProcess(
                key=name,
                device=self.name,
                asked=nbytes,
                free_only=free_only,
                started_at=self._last_t,
            )
            self._live[name] = proc
            self.processes.append(proc)
        else:
            proc.asked = nbytes
        self._recount()
        held = self.foreign[name]
        if proc is not None and nbytes > 0:
            held = proc.asked - proc.short
        return held

    def per_service(self) -> dict[str, int]:
        return {name: mem.total for name, mem in self.services.items()}


class HostCache:
    """Host RAM holding model files: the page cache, the same for every policy.

    A load reads a service's weights from here (at the device's host bandwidth) when
    the file is still cached, else from disk (its load bandwidth), and leaves it
    cached. Files are dropped least recently read first when room is needed, except
    those ``held``: weights a backend keeps in host RAM on purpose (parked, or a
    sleeping process's), which stay until released.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.files: dict[str, int] = {}  # least recently read first
        self.held: set[str] = set()

    @property
    def used(self) -> int:
        return sum(self.files.values())

    def holds(self, service: str) -> bool:
        return service in self.files

    def read(self, service: str, nbytes: int) -> None:
        """The weights were read (or copied back): cache them, most recent last."""
        self.files.pop(service, None)
        for name in list(self.files):
            if self.used + nbytes <= self.capacity:
                break
            if name not in self.held:
                del self.files[name]
        if self.used + nbytes <= self.capacity:
            self.files[service] = nbytes

    def hold(self, service: str, nbytes: int) -> None:
        """Keep the weights in host RAM until :meth:`release` (if they fit)."""
        self.read(service, nbytes)
        if service in self.files:
            self.held.add(service)

    def release(self, service: str) -> None:
        """No longer held on purpose: an ordinary cached file again."""
        self.held.discard(service)
