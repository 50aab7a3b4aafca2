"""Who may hold the front door's connections: per client, per key, and the reserve.

The bookkeeping and the decisions only (no socket, no clock, no web stack): each HTTP
listener (:mod:`.connections` for every stack) asks :class:`SlotBook` where a newcomer
goes and tells it who holds what, and :class:`RateWindow` whether a body arrives fast
enough. One client, or one stolen key, can then hold at most its share of the door:

- **per client**: at most ``server.connections_per_address`` connections from one address
  (an IPv6 address counts by its /64, what one home network is given), and at most
  ``server.connections_per_key`` connections whose latest request authenticated with one
  key. One more closes that client's (or key's) oldest idle connection, or is refused
  with 429 ``per_client_limit``.
- **the reserve**: ``server.reserved_connections`` of ``server.max_connections`` (at most a
  quarter) are taken only when the others are all taken, and only by a request for
  ``/health`` or for a realtime service (voice); anything else asked on a reserved
  connection gets 503 ``too_many_connections``.
- **the body rate**: a body that, while it is read, brings fewer than
  ``server.min_body_rate`` bytes a second over a window of ``server.body_rate_window_s``
  is cut with 408 ``body_too_slow``.
- **keyless strikes**: an address whose requests were refused for their key more than
  :data:`STRIKES` times within :data:`STRIKE_WINDOW_S` has its new connections refused
  at accept (429 ``per_client_limit``) for :data:`BAR_S`: a refusal at accept costs
  the daemon far less than reading a request's head to refuse it, so a client that
  reconnects in a loop without a key costs little (:class:`KeylessStrikes`).
"""

from __future__ import annotations

import enum
import ipaddress
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from accelmux.config.server import ServerConfig
from accelmux.core.types import ServiceKind

#: A client address that says nothing (a Unix socket, a test transport).
UNKNOWN_CLIENT = "?"
#: The reserve is at most this share of ``server.max_connections``.
MAX_RESERVED_SHARE = 4
#: The service kinds each Ollama inference route reaches (OpenAI's are in gateway.parse).
OLLAMA_ROUTE_KINDS: dict[str, tuple[ServiceKind, ...]] = {
    "/api/chat": (ServiceKind.CHAT, ServiceKind.COMPLETION),
    "/api/generate": (ServiceKind.CHAT, ServiceKind.COMPLETION),
    "/api/embed": (ServiceKind.EMBEDDINGS,),
    "/api/embeddings": (ServiceKind.EMBEDDINGS,),
}
#: Answered on a reserved connection whatever the services are.
ALWAYS_PRIORITY = frozenset({"/health"})
#: Key refusals of one address within STRIKE_WINDOW_S beyond which it is barred for BAR_S.
STRIKES = 100
STRIKE_WINDOW_S = 10.0
BAR_S = 10.0
#: Addresses remembered at most (the oldest forgotten first).
MAX_STRUCK = 10_000


class Place(enum.Enum):
    """Where a newcomer goes."""

    ORDINARY = "ordinary"
    RESERVE = "reserve"
    #: its client holds its share already
    PER_CLIENT = "per_client_limit"
    #: every connection, the reserve's too, is taken
    FULL = "too_many_connections"


@dataclass(frozen=True, slots=True, kw_only=True)
class FairnessLimits:
    max_connections: int
    reserved: int
    per_address: int
    per_key: int
    min_body_rate: float
    body_rate_window_s: float

    @classmethod
    def of(cls, cfg: ServerConfig) -> FairnessLimits:
        return cls(
            max_connections=cfg.max_connections,
            reserved=min(cfg.reserved_connections, cfg.max_connections // MAX_RESERVED_SHARE),
            per_address=cfg.connections_per_address,
            per_key=cfg.connections_per_key,
            min_body_rate=float(cfg.min_body_rate),
            body_rate_window_s=cfg.body_rate_window_s,
        )

    @property
    def ordinary(self) -> int:
        """Connections anyone may take before the reserve."""
        return self.max_connections - self.reserved


def client_of(address: str | None) -> str:
    """The client an address belongs to: an IPv4 address itself, an IPv6 address by its
    /64 (an IPv4-mapped one as IPv4); :data:`UNKNOWN_CLIENT` for no address."""
    if not address:
        return UNKNOWN_CLIENT
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


@dataclass(slots=True, eq=False)
class Seat:
    """One connection's place in the book."""

    client: str
    reserve: bool
    key: str | None = None
    held: bool = True


class SlotBook:
    """The connections held: in all, in the reserve, per client and per key."""

    def __init__(self, limits: FairnessLimits) -> None:
        self.limits = limits
        self.ordinary = 0
        self.reserve = 0
        self.by_client: Counter[str] = Counter()
        self.by_key: Counter[str] = Counter()

    def place(self, client: str) -> Place:
        """Where a newcomer from ``client`` would go now (nothing is taken)."""
        limits = self.limits
        if self.by_client[client] >= limits.per_address:
            return Place.PER_CLIENT
        if self.ordinary < limits.ordinary:
            return Place.ORDINARY
        if self.reserve < limits.reserved:
            return Place.RESERVE
        return Place.FULL

    def take(self, client: str, place: Place) -> Seat:
        """Seat a newcomer where :meth:`place` said (ORDINARY or RESERVE)."""
        if place not in (Place.ORDINARY, Place.RESERVE):
            raise ValueError(f"no seat for {place.value}")
        reserve = place is Place.RESERVE
        if reserve:
            self.reserve += 1
        else:
            self.ordinary += 1
        self.by_client[client] += 1
        return Seat(client=client, reserve=reserve)

    def key_full(self, seat: Seat, key: str) -> bool:
        """Whether ``key`` holds its share already on connections other than ``seat``'s."""
        others = self.by_key[key] - (1 if seat.key == key else 0)
        return others >= self.limits.per_key

    def claim_key(self, seat: Seat, key: str | None) -> None:
        """``seat``'s latest request authenticated with ``key`` (None: with none)."""
        if seat.key == key or not seat.held:
            return
        self._drop_key(seat)
        seat.key = key
        if key is not None:
            self.by_key[key] += 1

    def give_back(self, seat: Seat) -> None:
        """``seat`` no longer counts (closed, or refused and lingering); idempotent."""
        if not seat.held:
            return
        seat.held = False
        if seat.reserve:
            self.reserve -= 1
        else:
            self.ordinary -= 1
        _decrement(self.by_client, seat.client)
        self._drop_key(seat)

    def _drop_key(self, seat: Seat) -> None:
        if seat.key is not None:
            _decrement(self.by_key, seat.key)
            seat.key = None


def _decrement(counter: Counter[str], name: str) -> None:
    counter[name] -= 1
    if counter[name] <= 0:
        del counter[name]


@dataclass(slots=True)
class RateWindow:
    """The minimum body rate, window by window: at the end of each window of ``window_s``
    while a body is read, at least ``rate x window_s`` bytes must have arrived in it."""

    started: float = 0.0
    received: int = 0

    def restart(self, now: float, received: int) -> None:
        """A window starts now (a body begins, or reading it resumes after a pause)."""
        self.started = now
        self.received = received

    def too_slow(self, now: float, received: int, rate: float, window_s: float) -> bool:
        """Whether the window that ended by ``now`` brought too little (a new one then
        starts); False while the window is still open or no minimum is set."""
        if rate <= 0 or now - self.started < window_s:
            return False
        brought = received - self.received
        if brought < rate * window_s:
            return True
        self.restart(now, received)
        return False


def realtime_paths(
    route_kinds: Mapping[str, Iterable[ServiceKind]], realtime_kinds: Iterable[ServiceKind]
) -> frozenset[str]:
    """The paths a reserved connection may ask for: ``/health``, and each route that can
    reach a service of one of ``realtime_kinds`` (the request's model then decides)."""
    kinds = frozenset(realtime_kinds)
    reach = {path for path, served in route_kinds.items() if kinds.intersection(served)}
    return ALWAYS_PRIORITY | reach


class KeylessStrikes:
    """Key refusals per address, and the addresses barred for them (see the module)."""

    def __init__(
        self, strikes: int = STRIKES, window_s: float = STRIKE_WINDOW_S, bar_s: float = BAR_S
    ) -> None:
        self.strikes, self.window_s, self.bar_s = strikes, window_s, bar_s
        #: client -> (refusals in the window, the window's start, barred until)
        self._seen: dict[str, tuple[int, float, float]] = {}

    def strike(self, client: str, now: float) -> None:
        """A request of ``client`` was refused for its key at ``now``."""
        count, start, until = self._seen.pop(client, (0, now, 0.0))
        if now - start > self.window_s:
            count, start = 0, now
        count += 1
        if count > self.strikes:
            until, count, start = now + self.bar_s, 0, now
        self._seen[client] = (count, start, until)  # re-inserted last: dicts keep LRU order
        if len(self._seen) > MAX_STRUCK:
            del self._seen[next(iter(self._seen))]

    def barred(self, client: str, now: float) -> float:
        """Seconds ``client`` stays barred (0: it is not)."""
        seen = self._seen.get(client)
        return max(0.0, seen[2] - now) if seen is not None else 0.0
