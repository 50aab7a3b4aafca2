"""One cache for everything a round (and the rounds after it) may reuse: :class:`RoundCache`.

Each entry is kept with the stamp it was computed at (the world's ``version``: no
operation ran since; a device's epoch: nothing on it changed since; or a record of what
it read) and is reused only while that stamp holds, so a kept value is the value a fresh
computation would give. ``RoundCache(view, enabled=False)`` keeps nothing: every value
is computed afresh and the round skips nothing it would otherwise skip (a quiet device,
a request already told why it waits, a failed room survey); the decisions are the same
(``tests/core/test_round_cache.py`` checks it on random event streams).

What is kept, and for how long:

- per round (:meth:`RoundCache.new_round` drops them): per-device aggregates (memory on
  its way back, kept services' floors, the realtime and steady reserves, whether memory
  is wanted or spare, what realtime work could take back), room surveys that could not
  cover a need, the devices with realtime work, restores pending and the restorable
  services, TTL ranges, why a service's requests wait in a class's turn;
- across rounds: the realtime reserve per device (against its epoch and the realtime
  peaks seen), a waiting request's load sizes (against its service's calibrations), the
  window edges of the queued services and the evicted warm services (against their
  sets' versions), and the devices whose last round changed nothing;
- per spec: the warm services, who yields to realtime work, where time sharing can pause
  a stream.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from enum import Enum
from typing import Any, Generic, Literal, TypeVar

from accelmux.core.types import Reason, ServiceClass
from accelmux.core.world import RequestState, ServiceState, WorldView

K = TypeVar("K", bound=Hashable)
S = TypeVar("S")
V = TypeVar("V")


class Miss(Enum):
    """What :meth:`Memo.get` answers when it keeps nothing valid for the key."""

    MISS = 0


class Memo(Generic[K, S, V]):
    """Values by key, each with the stamp it was computed at."""

    __slots__ = ("_on", "dirty", "entries")

    def __init__(self, on: bool) -> None:
        self._on = on
        #: key -> (stamp, value); empty while the cache is off (the hottest callers read
        #: it directly: an entry counts only when its stamp is the one they hold).
        self.entries: dict[K, tuple[S, V]] = {}
        #: Where a memo kept for one round notes that it holds something (its cache's
        #: list of memos to clear at the next round); None for the others.
        self.dirty: list[Memo[Any, Any, Any]] | None = None

    def get(self, key: K, stamp: S) -> V | Literal[Miss.MISS]:
        """The value kept for ``key`` if it was computed at ``stamp``."""
        hit = self.entries.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        return Miss.MISS

    def put(self, key: K, stamp: S, value: V) -> V:
        """Keep ``value`` for ``key`` as computed at ``stamp`` (not when disabled)."""
        if self._on:
            entries = self.entries
            if not entries and self.dirty is not None:
                self.dirty.append(self)
            entries[key] = (stamp, value)
        return value

    def clear(self) -> None:
        self.entries.clear()

    def keep_only(self, wanted: Callable[[K], bool]) -> None:
        """Forget the entries whose key is not ``wanted``."""
        self.entries = {k: v for k, v in self.entries.items() if wanted(k)}

    def __len__(self) -> int:
        return len(self.entries)


#: A room survey's key: (device, class, for a steady service, strict, the requester's
#: service when it holds memory, what time sharing reads of the requester, whether
#: pinned services may go: ``Room.unpins``, whether the requester aged: ``RoomFor.aged``).
RoomKey = tuple[str, ServiceClass, bool, bool, str | None, object, bool, bool]


class RoundCache:
    """The policy's one cache (see the module docstring)."""

    def __init__(self, view: WorldView, *, enabled: bool = True) -> None:
        self.view = view
        self.enabled = enabled
        on = enabled
        # ---- per round
        self.pending_free: Memo[str, int, int] = Memo(on)
        self.kept_floor: Memo[str, int, int] = Memo(on)
        self.realtime_reserve: Memo[str, int, int] = Memo(on)
        self.memory_wanted: Memo[str, int, bool] = Memo(on)
        self.memory_spare: Memo[str, int, int] = Memo(on)
        self.quickly_freeable: Memo[str, int, int] = Memo(on)
        self.steady_reserve: Memo[str, int, int] = Memo(on)
        self.room_failed: Memo[RoomKey, int, int] = Memo(on)
        self.realtime_devices: Memo[None, None, set[str]] = Memo(on)
        self.restorable: Memo[str, tuple[int, float], list[list[Any]]] = Memo(on)
        self.restores: Memo[str, tuple[int, float], bool] = Memo(on)
        self.ttl_range: Memo[str, int, tuple[float, float]] = Memo(on)
        self.service_waits: Memo[
            tuple[str, ServiceClass], int, tuple[bool, tuple[Reason, str] | None]
        ] = Memo(on)
        #: Per device, which streams there time sharing could pause now.
        self.share_thresholds: Memo[str, None, tuple[object, ...]] = Memo(on)
        #: Per (device, class), what deciding a request waiting for a load there reads of
        #: the device and the round (``Schedule.device_inputs``).
        self.device_inputs: Memo[
            tuple[str, ServiceClass], tuple[int, int, ServiceClass | None], tuple[object, ...]
        ] = Memo(on)
        #: Every memo above: those :meth:`new_round` drops.
        self._per_round: tuple[Memo[Any, Any, Any], ...] = tuple(
            memo for memo in vars(self).values() if isinstance(memo, Memo)
        )
        self._filled = _noting_filled(self._per_round)  # those :meth:`new_round` clears
        # ---- across rounds
        self.reserves: Memo[str, tuple[int, int], int] = Memo(on)
        self.load_sizes: Memo[
            str, tuple[int, int], tuple[RequestState, tuple[int, int, int, int]]
        ] = Memo(on)
        self.window_edges: Memo[None, int, tuple[float, ...]] = Memo(on)
        self.evicted_warm: Memo[None, int, list[ServiceState]] = Memo(on)
        self.quiet: Memo[str, int, tuple[tuple[object, ...], float]] = Memo(on)
        #: Per device, the TTLs of its services whose TTL runs (``Residents.device_ttls``).
        self.device_ttls: Memo[str, tuple[int, int], Any] = Memo(on)
        #: Per (device, class, steady) turn whose requests were all left out or replayed:
        #: the state then (``Schedule.unsettled``), until when the clock keeps it, and
        #: whether they set the round's blocked class.
        self.turns: Memo[tuple[str, ServiceClass, bool | None], object, tuple[float, bool]] = Memo(
            on
        )
        #: Per waiting request of a service that is down, what its last consideration
        #: read (``Schedule.inputs_of``) and whether it marked its device blocked, when
        #: it did nothing else: it waited for memory again.
        self.considered: Memo[str, tuple[object, ...], bool] = Memo(on)
        # ---- per spec
        self.yields_to_realtime: Memo[str, None, bool] = Memo(on)
        self.sharing_devices: Memo[None, None, frozenset[str]] = Memo(on)
        self.shared_compute: Memo[None, None, frozenset[str]] = Memo(on)
        self.pausing_devices: Memo[None, None, frozenset[str]] = Memo(on)
        self.warm: Memo[str, None, list[ServiceState]] = Memo(on)
        self.warm_in_class_order: Memo[None, None, list[ServiceState]] = Memo(on)
        self.service_edges: Memo[str, None, tuple[float, ...]] = Memo(on)

    def new_round(self) -> None:
        """A round starts: drop what holds for one round only, and the load sizes of
        requests that wait no more (once they outnumber the waiting ones)."""
        filled = self._filled
        if filled:
            for memo in filled:
                memo.entries.clear()
            filled.clear()
        waiting = self.view.waiting
        if len(self.load_sizes) > 2 * len(waiting) + 64:
            self.load_sizes.keep_only(lambda rid: rid in waiting)
        if len(self.considered) > 2 * len(waiting) + 64:
            self.considered.keep_only(lambda rid: rid in waiting)


def _noting_filled(memos: tuple[Memo[Any, Any, Any], ...]) -> list[Memo[Any, Any, Any]]:
    """The list each of ``memos`` notes itself in when it keeps its first entry: the
    per-round memos that kept something since the last round, the only ones a new round
    clears (a round on a small home fills few of them)."""
    filled: list[Memo[Any, Any, Any]] = []
    for memo in memos:
        memo.dirty = filled
    return filled
