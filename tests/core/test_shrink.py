"""A batch service that declares ``shrink`` runs smaller batches under memory pressure
and grows back when room returns (core/shrink.py, policies/accelmux/shrinking.py)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accelmux.core.actions import Action, Dispatch, Preempt, Rebatch, Unload
from accelmux.core.events import Tick, Unloaded
from accelmux.core.manager import Manager
from accelmux.core.shrink import BatchShrink
from accelmux.core.types import GIB, MIB, Reason, ServiceClass, ServiceKind

from .support import arrive, done, loaded, manager, of, plain_profile, service

UNITS = 64.0


def _home(
    chat_gib: float = 8.0, *, shrink: BatchShrink | None = None, concurrency: int = 2
) -> Manager:
    """An interactive chat (idle once it answered: batch work may not evict it) and a
    batch indexer whose full batch (64 units of 64 MiB) is about 5 GiB."""
    chat = service(
        "chat", ttl_s=10.0, profile=plain_profile(weights=int(chat_gib * GIB), workspace=100 * MIB)
    )
    indexer = dataclasses.replace(
        service(
            "indexer",
            cls=ServiceClass.BATCH,
            kind=ServiceKind.EMBEDDINGS,
            concurrency=concurrency,
            profile=plain_profile(weights=GIB, workspace=64 * MIB, per_unit=float(64 * MIB)),
        ),
        shrink=shrink,
    )
    return manager(chat, indexer)


def _chat_then_batch(m: Manager) -> list[Action]:
    """Chat answers once and stays loaded; then two indexer requests arrive."""
    out = m.handle(arrive("c1", "chat"), 0.0)
    out += m.handle(loaded("chat"), 1.0)
    out += m.handle(done("c1"), 2.0)
    out += m.handle(arrive("i1", "indexer", units=UNITS), 3.0)
    out += m.handle(loaded("indexer"), 4.0)
    out += m.handle(arrive("i2", "indexer", units=UNITS), 4.5)
    return out


def test_without_shrink_the_batch_waits() -> None:
    """Today's behaviour, kept for a service that declares nothing: its full batch does
    not fit beside the idle chat, so it waits (no_memory) and never runs."""
    out = _chat_then_batch(_home())
    assert not of(Dispatch, [a for a in out if a.service == "indexer"])
    assert not of(Rebatch, out)


def test_shrinks_under_pressure_and_grows_back() -> None:
    m = _home(shrink=BatchShrink(min_fraction=0.125))
    out = _chat_then_batch(m)
    shrunk = of(Rebatch, out)
    assert [(r.request_id, r.reason, r.fraction, r.parallel) for r in shrunk] == [
        ("i1", Reason.BATCH_SHRUNK, 0.5, 1)
    ]
    assert "MiB at the full batch" in shrunk[0].detail and "MiB free" in shrunk[0].detail
    first = [d for d in of(Dispatch, out) if d.service == "indexer"]
    assert [d.request_id for d in first] == ["i1"]  # parallelism shrank to 1: i2 waits
    assert first[0].lease_bytes < 3 * GIB
    out = m.handle(done("i1"), 5.0)
    assert [d.request_id for d in of(Dispatch, out)] == ["i2"]
    assert not of(Rebatch, out)  # the same batch: nothing new to say
    out = m.handle(done("i2"), 6.0)
    # the chat's TTL runs out and room returns
    out = m.handle(Tick(), 12.5)
    assert [u.service for u in of(Unload, out)] == ["chat"]
    m.handle(Unloaded(service="chat"), 13.0)
    out = m.handle(arrive("i3", "indexer", units=UNITS), 14.0)
    grown = of(Rebatch, out)
    assert [(r.reason, r.fraction, r.parallel) for r in grown] == [(Reason.BATCH_GROWN, 1.0, 2)]
    assert not of(Unload, out) and not of(Preempt, out)  # growing back evicts no one
    (dispatch,) = of(Dispatch, out)
    assert dispatch.lease_bytes > 4 * GIB


def test_explain_says_why() -> None:
    m = _home(shrink=BatchShrink(min_fraction=0.125))
    _chat_then_batch(m)
    lines = m.explain("i1") or []
    assert any("rebatch (batch_shrunk)" in line for line in lines), lines


def test_fractions_and_parallelism() -> None:
    s = BatchShrink(min_fraction=0.2, min_parallel=2)
    assert s.fractions() == (1.0, 0.5, 0.25, 0.2)
    assert s.parallel(1.0, 4) == 4 and s.parallel(0.25, 4) == 2 and s.parallel(0.5, 1) == 1
    with pytest.raises(ValueError, match="min_fraction"):
        BatchShrink(min_fraction=1.0)


@settings(max_examples=40, deadline=None)
@given(
    chat_gib=st.floats(min_value=2.0, max_value=10.0),
    min_fraction=st.sampled_from([0.05, 0.125, 0.25, 0.5]),
    units=st.floats(min_value=1.0, max_value=120.0),
)
def test_a_shrunk_batch_fits_the_free_memory_it_was_given(
    chat_gib: float, min_fraction: float, units: float
) -> None:
    """Whatever the pressure: a shrunk or grown batch's lease never exceeds the memory
    free before it (it evicts and stops no one), never goes below the smallest batch
    allowed, and the ledger never commits more than the device's usable bytes."""
    m = _home(chat_gib, shrink=BatchShrink(min_fraction=min_fraction))
    m.handle(arrive("c1", "chat"), 0.0)
    m.handle(loaded("chat"), 1.0)
    m.handle(done("c1"), 2.0)
    t = 3.0
    for i in range(4):
        free_before = m.view.ledger.available("gpu")
        out = m.handle(arrive(f"i{i}", "indexer", units=units), t)
        if m.view.services["indexer"].status.value == "loading":
            t += 0.5
            free_before = m.view.ledger.available("gpu")
            out = m.handle(loaded("indexer"), t)
        for r in of(Rebatch, out):
            assert min_fraction <= r.fraction <= 1.0
            (d,) = [d for d in of(Dispatch, out) if d.request_id == r.request_id]
            assert d.lease_bytes <= free_before
            assert not of(Unload, out) and not of(Preempt, out)
        ledger = m.view.ledger
        assert ledger.available("gpu") >= 0
        for d in of(Dispatch, out):
            t += 0.5
            m.handle(done(d.request_id), t)
        t += 1.0
