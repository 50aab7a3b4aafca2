"""The memory ledger: bytes per device x service x category.

Categories per service: weights, runtime, kv (the KV pool), active (leases of in-flight
requests), reserved (measured memory above what was accounted, e.g. allocator caches)
and leftover (memory measured for a service that is not loaded). Per device: headroom
(kept free for transient peaks), foreign (memory of processes accelmux does not
control) and parked (host RAM the park budget holds, on the device that RAM is).

Admission is against ``available = budget - headroom - foreign - parked - committed``.
``reserve`` returns a :class:`Lease` or ``None`` when it does not fit: not fitting is a
decision, not an error. Releasing a lease twice, or committing more than the usable
budget through ``enforce=True``, raises :class:`~accelmux.errors.InvariantError`.
"""

from __future__ import annotations

from dataclasses import dataclass

from accelmux.core.specs import DeviceSpec
from accelmux.core.types import MEASURED_CATEGORIES, SERVICE_CATEGORIES, Category
from accelmux.errors import InvariantError

#: Categories that hold what the manager decided (estimates it admitted).
DECIDED: tuple[Category, ...] = (Category.WEIGHTS, Category.RUNTIME, Category.KV, Category.ACTIVE)


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    lease_id: int
    device: str
    service: str
    category: Category
    nbytes: int


class _DeviceAccount:
    __slots__ = (
        "decided",
        "foreign",
        "overhead",
        "parked",
        "reserved_total",
        "services",
        "spec",
        "usable",
    )

    def __init__(self, spec: DeviceSpec) -> None:
        self.spec = spec
        self.usable = spec.usable_bytes  # the spec is frozen: read on every decision
        self.foreign = 0
        self.parked = 0
        #: measured memory of accelmux's inference workers beyond their services' share
        self.overhead = 0
        self.decided = 0
        #: Measured categories (reserved and leftover) of every service.
        self.reserved_total = 0
        self.services: dict[str, dict[Category, int]] = {}


class Ledger:
    """Per-device accounts. All amounts are bytes (ints)."""

    def __init__(self, devices: tuple[DeviceSpec, ...] | list[DeviceSpec]) -> None:
        self._devices: dict[str, _DeviceAccount] = {d.name: _DeviceAccount(d) for d in devices}
        self._leases: dict[int, Lease] = {}
        #: Open leases per (device, service), so dropping a service needs no scan.
        self._held: dict[tuple[str, str], int] = {}
        self._next_lease = 1

    # ---- reading -------------------------------------------------------------
    def device_names(self) -> list[str]:
        return list(self._devices)

    def spec(self, device: str) -> DeviceSpec:
        return self._devices[device].spec

    def amount(self, device: str, service: str, category: Category) -> int:
        return self._devices[device].services.get(service, {}).get(category, 0)

    def service_total(self, device: str, service: str) -> int:
        return sum(self._devices[device].services.get(service, {}).values())

    def service_breakdown(self, device: str, service: str) -> dict[Category, int]:
        acc = self._devices[device].services.get(service, {})
        return {c: acc.get(c, 0) for c in SERVICE_CATEGORIES}

    def decided(self, device: str) -> int:
        """Bytes the manager admitted on this device (weights+runtime+kv+active)."""
        return self._devices[device].decided

    def committed(self, device: str) -> int:
        """Everything held by managed services: decided plus measured (reserved, leftover)."""
        acc = self._devices[device]
        return acc.decided + acc.reserved_total

    def foreign(self, device: str) -> int:
        return self._devices[device].foreign

    def parked(self, device: str) -> int:
        """Host RAM the park budget holds on this device (0 but on the host device)."""
        return self._devices[device].parked

    def overhead(self, device: str) -> int:
        """The workers' measured memory on this device beyond their services' share."""
        return self._devices[device].overhead

    def available(self, device: str) -> int:
        """budget - headroom - foreign - overhead - parked - committed (negative under
        pressure)."""
        acc = self._devices[device]
        return (
            acc.usable - acc.foreign - acc.overhead - acc.parked - acc.decided - acc.reserved_total
        )

    def lease_count(self) -> int:
        return len(self._leases)

    def leases(self) -> list[Lease]:
        return list(self._leases.values())

    # ---- writing -------------------------------------------------------------
    def _add(self, device: str, service: str, category: Category, delta: int) -> None:
        acc = self._devices[device]
        cats = acc.services.setdefault(service, {})
        new = cats.get(category, 0) + delta
        if new < 0:
            raise InvariantError(
                f"ledger {device}/{service}/{category.value} would go negative ({new})"
            )
        cats[category] = new
        if category in MEASURED_CATEGORIES:
            acc.reserved_total += delta
        else:
            acc.decided += delta

    def fits(self, device: str, nbytes: int) -> bool:
        return nbytes <= self.available(device)

    def reserve(
        self,
        device: str,
        service: str,
        category: Category,
        nbytes: int,
        *,
        enforce: bool = True,
    ) -> Lease | None:
        """Grant ``nbytes`` if it fits (or unconditionally with ``enforce=False``)."""
        if nbytes < 0:
            raise InvariantError(f"negative reservation {nbytes}")
        if category not in DECIDED:
            raise InvariantError(f"cannot lease category {category.value}")
        if enforce and not self.fits(device, nbytes):
            return None
        lease = Lease(
            lease_id=self._next_lease,
            device=device,
            service=service,
            category=category,
            nbytes=nbytes,
        )
        self._next_lease += 1
        self._add(device, service, category, nbytes)
        self._leases[lease.lease_id] = lease
        key = (device, service)
        self._held[key] = self._held.get(key, 0) + 1
        return lease

    def release(self, lease: Lease) -> None:
        if self._leases.pop(lease.lease_id, None) is None:
            raise InvariantError(f"lease {lease.lease_id} released twice or unknown")
        self._held[(lease.device, lease.service)] -= 1
        self._add(lease.device, lease.service, lease.category, -lease.nbytes)

    def set_foreign(self, device: str, nbytes: int) -> None:
        self._devices[device].foreign = max(0, nbytes)

    def set_parked(self, device: str, nbytes: int) -> None:
        self._devices[device].parked = max(0, nbytes)

    def set_overhead(self, device: str, nbytes: int) -> None:
        """The workers' measured overhead on ``device`` (see ``MemorySampled``)."""
        self._devices[device].overhead = max(0, nbytes)

    def set_reserved(self, device: str, service: str, nbytes: int) -> None:
        current = self.amount(device, service, Category.RESERVED)
        self._add(device, service, Category.RESERVED, max(0, nbytes) - current)

    def set_leftover(self, device: str, service: str, nbytes: int) -> None:
        """Charge ``nbytes`` measured for ``service`` while it is not loaded."""
        current = self.amount(device, service, Category.LEFTOVER)
        if current or nbytes > 0:
            self._add(device, service, Category.LEFTOVER, max(0, nbytes) - current)

    def leftovers(self, device: str) -> dict[str, int]:
        """Services charged leftover memory on ``device`` (bytes, > 0)."""
        out = {}
        for name, cats in self._devices[device].services.items():
            n = cats.get(Category.LEFTOVER, 0)
            if n:
                out[name] = n
        return out

    def drop_service(self, device: str, service: str) -> None:
        """Forget every byte of a service that has no leases left (after unload/crash)."""
        if self._held.get((device, service), 0):
            held = [le.lease_id for le in self._leases.values() if le.service == service]
            raise InvariantError(f"{service} still holds lease {held[0]}")
        acc = self._devices[device]
        cats = acc.services.pop(service, {})
        for cat, n in cats.items():
            if cat in MEASURED_CATEGORIES:
                acc.reserved_total -= n
            else:
                acc.decided -= n

    def check_totals(self) -> None:
        """Recompute the per-device totals and lease counts from scratch; raise if off."""
        held: dict[tuple[str, str], int] = {}
        for lease in self._leases.values():
            key = (lease.device, lease.service)
            held[key] = held.get(key, 0) + 1
        if {k: n for k, n in self._held.items() if n} != held:
            raise InvariantError(f"ledger lease counts {self._held} != {held}")
        for name, acc in self._devices.items():
            decided = sum(
                n for cats in acc.services.values() for c, n in cats.items() if c in DECIDED
            )
            reserved = sum(
                n for cats in acc.services.values() for c, n in cats.items() if c not in DECIDED
            )
            if (decided, reserved) != (acc.decided, acc.reserved_total):
                raise InvariantError(
                    f"ledger {name}: totals {(acc.decided, acc.reserved_total)} "
                    f"!= recomputed {(decided, reserved)}"
                )
