"""A subset of the services, iterated in spec order (the World's service indexes)."""

from __future__ import annotations

from collections.abc import Iterator

from accelmux.core.world.data import ServiceState


class ServiceSet:
    """A subset of the services, iterated in spec order; the World's mutators keep it.

    Iteration walks a snapshot: mutating the set inside the loop is safe, and a member
    removed meanwhile is still visited (loops re-check the state they filter on).
    """

    __slots__ = ("_members", "_ordered", "version")

    def __init__(self) -> None:
        self._members: dict[str, ServiceState] = {}
        self._ordered: list[ServiceState] | None = []
        #: Bumped by every change of members: what is derived from them may be kept.
        self.version = 0

    def add(self, svc: ServiceState) -> None:
        if svc.spec.name not in self._members:
            self._members[svc.spec.name] = svc
            self._ordered = None
            self.version += 1

    def discard(self, svc: ServiceState) -> None:
        if self._members.pop(svc.spec.name, None) is not None:
            self._ordered = None
            self.version += 1

    def update(self, svc: ServiceState, member: bool) -> None:
        if member:
            self.add(svc)
        else:
            self.discard(svc)

    def __contains__(self, svc: object) -> bool:
        return isinstance(svc, ServiceState) and svc.spec.name in self._members

    def __len__(self) -> int:
        return len(self._members)

    def __iter__(self) -> Iterator[ServiceState]:
        if self._ordered is None:
            self._ordered = sorted(self._members.values(), key=_spec_order)
        return iter(self._ordered)

    def names(self) -> set[str]:
        return set(self._members)


def _spec_order(svc: ServiceState) -> int:
    return svc.index
