"""The front door's books (gateway/fairness.py), by property: whatever order connections
open, authenticate and close in, the counts are what the open seats say, no client or key
holds more than its share, the reserve holds only what was placed there, and a seat is
given back once. The body-rate window, by cases."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from accelmux.core.types import ServiceKind
from accelmux.gateway.fairness import (
    FairnessLimits,
    KeylessStrikes,
    Place,
    RateWindow,
    Seat,
    SlotBook,
    client_of,
    realtime_paths,
)

LIMITS = FairnessLimits(
    max_connections=12,
    reserved=3,
    per_address=4,
    per_key=3,
    min_body_rate=100.0,
    body_rate_window_s=1.0,
)
CLIENTS = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"]
KEYS = [None, "k1", "k2"]

Op = tuple[str, int, int]
OPS = st.lists(
    st.tuples(st.sampled_from(["open", "claim", "close"]), st.integers(0, 40), st.integers(0, 40)),
    max_size=200,
)


def _check(book: SlotBook, seats: list[Seat]) -> None:
    held = [s for s in seats if s.held]
    assert book.ordinary == sum(not s.reserve for s in held)
    assert book.reserve == sum(s.reserve for s in held)
    assert book.ordinary <= LIMITS.ordinary and book.reserve <= LIMITS.reserved
    assert +book.by_client == Counter(s.client for s in held)
    assert +book.by_key == Counter(s.key for s in held if s.key is not None)
    assert all(n <= LIMITS.per_address for n in book.by_client.values())
    assert all(n <= LIMITS.per_key for n in book.by_key.values())


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_the_books_match_the_seats_and_no_share_is_exceeded(ops: list[Op]) -> None:
    book = SlotBook(LIMITS)
    seats: list[Seat] = []
    for op, a, b in ops:
        if op == "open":
            client = CLIENTS[a % len(CLIENTS)]
            place = book.place(client)
            if place in (Place.ORDINARY, Place.RESERVE):
                seats.append(book.take(client, place))
            elif place is Place.PER_CLIENT:
                assert book.by_client[client] == LIMITS.per_address
            else:
                assert book.ordinary + book.reserve == LIMITS.max_connections
        elif seats and op == "claim":
            seat, key = seats[a % len(seats)], KEYS[b % len(KEYS)]
            if key is None or not book.key_full(seat, key):
                book.claim_key(seat, key)
        elif seats and op == "close":
            seat = seats[a % len(seats)]
            book.give_back(seat)
            book.give_back(seat)  # a second time changes nothing
        _check(book, seats)


def test_the_reserve_is_taken_only_once_the_rest_is() -> None:
    book = SlotBook(LIMITS)
    places = []
    for i in range(LIMITS.max_connections + 1):
        client = f"10.1.0.{i}"
        place = book.place(client)
        places.append(place)
        if place is not Place.FULL:
            book.take(client, place)
    ordinary = LIMITS.ordinary
    assert places[:ordinary] == [Place.ORDINARY] * ordinary
    assert places[ordinary:-1] == [Place.RESERVE] * LIMITS.reserved
    assert places[-1] is Place.FULL


def test_clients_are_addresses_and_ipv6_networks() -> None:
    assert client_of("192.168.1.20") == "192.168.1.20"
    assert client_of("2001:db8::1") == client_of("2001:db8::ffff") == "2001:db8::/64"
    assert client_of("2001:db8:0:1::1") != client_of("2001:db8::1")
    assert client_of("::ffff:10.0.0.7") == "10.0.0.7"
    assert client_of("fe80::1%eth0") == "fe80::/64"
    assert client_of(None) == client_of("") == "?"


def test_the_body_rate_is_counted_window_by_window() -> None:
    window = RateWindow()
    window.restart(0.0, 0)
    assert not window.too_slow(0.5, 0, rate=100, window_s=1.0)  # the window is still open
    assert not window.too_slow(1.0, 150, rate=100, window_s=1.0)  # 150 bytes in 1 s: enough
    assert not window.too_slow(1.5, 160, rate=100, window_s=1.0)  # a new window is open
    assert window.too_slow(2.0, 200, rate=100, window_s=1.0)  # 50 bytes in that one
    assert not window.too_slow(50.0, 0, rate=0, window_s=1.0)  # no minimum


def test_a_reserved_connection_takes_health_and_what_realtime_services_serve() -> None:
    routes = {
        "/v1/audio/speech": (ServiceKind.TTS,),
        "/v1/chat/completions": (ServiceKind.CHAT, ServiceKind.COMPLETION),
        "/v1/embeddings": (ServiceKind.EMBEDDINGS,),
    }
    assert realtime_paths(routes, []) == {"/health"}
    assert realtime_paths(routes, [ServiceKind.TTS]) == {"/health", "/v1/audio/speech"}
    assert "/v1/chat/completions" in realtime_paths(routes, [ServiceKind.CHAT])


def test_an_address_that_keeps_failing_its_key_is_barred_for_a_while() -> None:
    strikes = KeylessStrikes(strikes=3, window_s=10.0, bar_s=5.0)
    for t in (0.0, 1.0, 2.0):
        strikes.strike("10.0.0.9", t)
    assert strikes.barred("10.0.0.9", 2.0) == 0.0  # three within the window: not yet
    strikes.strike("10.0.0.9", 3.0)  # the fourth
    assert strikes.barred("10.0.0.9", 4.0) == 4.0
    assert strikes.barred("10.0.0.9", 8.5) == 0.0  # the bar is over
    assert strikes.barred("10.0.0.8", 4.0) == 0.0  # another address is not touched
    for t in (20.0, 31.0, 42.0, 53.0):  # one refusal per window never adds up
        strikes.strike("10.0.0.7", t)
    assert strikes.barred("10.0.0.7", 53.0) == 0.0
