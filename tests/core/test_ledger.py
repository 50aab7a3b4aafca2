"""The memory ledger: leases, availability, reconciliation inputs and invariants."""

from __future__ import annotations

import pytest

from accelmux.core.ledger import Ledger
from accelmux.core.types import GIB, MIB, Category
from accelmux.errors import InvariantError

from .support import device


def make_ledger(budget: int = 10 * GIB, headroom: int = GIB) -> Ledger:
    return Ledger([device(budget=budget, headroom=headroom)])


def test_fresh_ledger_offers_budget_minus_headroom() -> None:
    ledger = make_ledger()
    assert ledger.device_names() == ["gpu"]
    assert ledger.available("gpu") == 9 * GIB
    assert ledger.decided("gpu") == ledger.committed("gpu") == ledger.foreign("gpu") == 0
    assert ledger.lease_count() == 0


def test_reserve_grants_a_lease_and_accounts_it() -> None:
    ledger = make_ledger()
    lease = ledger.reserve("gpu", "chat", Category.WEIGHTS, 4 * GIB)
    assert lease is not None
    assert (lease.device, lease.service, lease.category, lease.nbytes) == (
        "gpu",
        "chat",
        Category.WEIGHTS,
        4 * GIB,
    )
    assert ledger.amount("gpu", "chat", Category.WEIGHTS) == 4 * GIB
    assert ledger.decided("gpu") == 4 * GIB
    assert ledger.available("gpu") == 5 * GIB
    assert ledger.service_total("gpu", "chat") == 4 * GIB
    assert ledger.service_breakdown("gpu", "chat") == {
        Category.WEIGHTS: 4 * GIB,
        Category.RUNTIME: 0,
        Category.KV: 0,
        Category.ACTIVE: 0,
        Category.RESERVED: 0,
        Category.LEFTOVER: 0,
    }
    assert ledger.leases() == [lease]


def test_lease_ids_are_unique_and_increasing() -> None:
    ledger = make_ledger()
    ids = [ledger.reserve("gpu", "a", Category.ACTIVE, 1).lease_id for _ in range(5)]  # type: ignore[union-attr]
    assert ids == sorted(set(ids))


def test_reserve_that_does_not_fit_is_a_decision_not_an_error() -> None:
    ledger = make_ledger()
    assert ledger.reserve("gpu", "chat", Category.ACTIVE, 9 * GIB + 1) is None
    assert ledger.lease_count() == 0
    assert ledger.decided("gpu") == 0
    # exactly the available amount fits
    assert ledger.reserve("gpu", "chat", Category.ACTIVE, 9 * GIB) is not None
    assert ledger.available("gpu") == 0
    assert ledger.fits("gpu", 0)
    assert not ledger.fits("gpu", 1)


def test_reserve_without_enforce_may_overcommit() -> None:
    ledger = make_ledger()
    lease = ledger.reserve("gpu", "x", Category.KV, 20 * GIB, enforce=False)
    assert lease is not None
    assert ledger.available("gpu") == 9 * GIB - 20 * GIB


@pytest.mark.parametrize("category", [Category.RESERVED, Category.HEADROOM, Category.FOREIGN])
def test_only_service_categories_can_be_leased(category: Category) -> None:
    with pytest.raises(InvariantError):
        make_ledger().reserve("gpu", "x", category, 1)


def test_negative_reservation_raises() -> None:
    with pytest.raises(InvariantError):
        make_ledger().reserve("gpu", "x", Category.ACTIVE, -1)


def test_release_returns_memory_and_twice_raises() -> None:
    ledger = make_ledger()
    lease = ledger.reserve("gpu", "chat", Category.ACTIVE, GIB)
    assert lease is not None
    ledger.release(lease)
    assert ledger.available("gpu") == 9 * GIB
    assert ledger.lease_count() == 0
    with pytest.raises(InvariantError, match="twice"):
        ledger.release(lease)


def test_foreign_and_reserved_shrink_availability_but_not_decided() -> None:
    ledger = make_ledger()
    ledger.reserve("gpu", "chat", Category.WEIGHTS, 2 * GIB)
    ledger.set_foreign("gpu", 3 * GIB)
    ledger.set_reserved("gpu", "chat", 500 * MIB)
    assert ledger.foreign("gpu") == 3 * GIB
    assert ledger.decided("gpu") == 2 * GIB
    assert ledger.committed("gpu") == 2 * GIB + 500 * MIB
    assert ledger.available("gpu") == 9 * GIB - 3 * GIB - 2 * GIB - 500 * MIB
    # a new measurement replaces the old one, it does not add to it
    ledger.set_reserved("gpu", "chat", 100 * MIB)
    assert ledger.amount("gpu", "chat", Category.RESERVED) == 100 * MIB
    assert ledger.committed("gpu") == 2 * GIB + 100 * MIB


def test_negative_measurements_clamp_to_zero() -> None:
    ledger = make_ledger()
    ledger.set_foreign("gpu", -5)
    ledger.set_reserved("gpu", "chat", -5)
    assert ledger.foreign("gpu") == 0
    assert ledger.amount("gpu", "chat", Category.RESERVED) == 0


def test_available_may_go_negative_under_foreign_pressure() -> None:
    ledger = make_ledger()
    ledger.reserve("gpu", "chat", Category.WEIGHTS, 8 * GIB)
    ledger.set_foreign("gpu", 2 * GIB)
    assert ledger.available("gpu") == -GIB
    assert not ledger.fits("gpu", 0)
    assert ledger.reserve("gpu", "chat", Category.ACTIVE, 0) is None


def test_drop_service_requires_released_leases_and_forgets_reserved() -> None:
    ledger = make_ledger()
    lease = ledger.reserve("gpu", "chat", Category.WEIGHTS, GIB)
    assert lease is not None
    ledger.set_reserved("gpu", "chat", 300 * MIB)
    with pytest.raises(InvariantError, match="still holds"):
        ledger.drop_service("gpu", "chat")
    ledger.release(lease)
    ledger.drop_service("gpu", "chat")
    assert ledger.committed("gpu") == 0
    assert ledger.service_total("gpu", "chat") == 0
    ledger.drop_service("gpu", "never-seen")  # nothing to forget is fine


def test_devices_are_accounted_separately() -> None:
    ledger = Ledger([device("a", budget=4 * GIB, headroom=0), device("b", budget=8 * GIB)])
    ledger.reserve("a", "x", Category.WEIGHTS, 4 * GIB)
    assert ledger.available("a") == 0
    assert ledger.available("b") == 8 * GIB - GIB // 2
    assert ledger.spec("b").budget_bytes == 8 * GIB
