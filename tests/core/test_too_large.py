"""``too_large`` is decided by configured figures against the empty device only.

A request whose service's estimate fits its device's usable budget is never refused
``too_large`` (413, "do not retry"), whatever the services kept loaded beside it are
measured to hold: what they hold may change (the operator unloads one, an allocator
gives memory back), so such a request is refused for now (``no_memory``, with a
Retry-After) or waits. Found on the real stack: a completion model's requests were
refused ``too_large`` once the pinned voice models' allocator caches grew by a few MB
(bench/bench_stack_llms.py, 35 refusals in one run).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from accelmux.core.events import AdminCommand, MemorySampled, Tick
from accelmux.core.manager import Manager
from accelmux.core.types import GIB, MIB, Reason, Residency, ServiceClass

from .support import EXACT, arrive, device, loaded, manager, plain_profile, rejected, service


def _home(kept_gib: float, new_gib: float) -> Manager:
    kept = service(
        "kept",
        cls=ServiceClass.REALTIME,
        residency=Residency.PINNED,
        profile=plain_profile(weights=int(kept_gib * GIB), workspace=0),
    )
    new = service("new", profile=plain_profile(weights=int(new_gib * GIB), workspace=64 * MIB))
    return manager(kept, new, devices=(device(budget=8 * GIB, headroom=0),), knobs=EXACT)


def test_an_estimate_larger_than_the_empty_device_is_too_large() -> None:
    m = _home(1.0, 8.5)
    m.start(0.0)
    m.handle(loaded("kept"), 0.1)
    refused = rejected(m.handle(arrive("n1", "new"), 1.0))["n1"]
    assert refused.reason is Reason.TOO_LARGE
    assert "holds even empty" in refused.detail


def test_a_kept_service_measured_larger_refuses_for_now_not_as_too_large() -> None:
    # 3 GiB kept + 4 GiB new fit 8 GiB as configured; measured, the kept one holds 5 GiB
    m = _home(3.0, 4.0)
    m.start(0.0)
    m.handle(loaded("kept"), 0.1)
    sample = MemorySampled(device="gpu", used_bytes=5 * GIB, per_service={"kept": 5 * GIB})
    m.handle(sample, 0.5)
    out = m.handle(arrive("n1", "new"), 1.0)
    refused = rejected(out).get("n1")
    assert refused is None or refused.reason is not Reason.TOO_LARGE


@settings(max_examples=120, deadline=None)
@given(
    kept_gib=st.floats(0.25, 7.5),
    new_gib=st.floats(0.25, 9.0),
    samples=st.lists(st.floats(0.0, 9.0), max_size=8),
    admin_load=st.booleans(),
)
def test_an_estimate_that_fits_the_empty_device_is_never_too_large(
    kept_gib: float, new_gib: float, samples: list[float], admin_load: bool
) -> None:
    """Whatever the kept services are measured to hold, ``new`` is refused ``too_large``
    only when its own estimate (weights and its activations) exceeds the usable budget."""
    m = _home(kept_gib, new_gib)
    m.start(0.0)
    m.handle(loaded("kept"), 0.1)
    if admin_load:
        m.handle(AdminCommand(service="kept", op="load"), 0.2)
    now = 1.0
    fits_empty = int(new_gib * GIB) + 64 * MIB <= 8 * GIB
    for i, held_gib in enumerate(samples):
        held = int(held_gib * GIB)
        m.handle(MemorySampled(device="gpu", used_bytes=held, per_service={"kept": held}), now)
        out = m.handle(arrive(f"n{i}", "new"), now + 0.1)
        out += m.handle(Tick(), now + 0.2)
        for r in rejected(out).values():
            assert r.reason is not Reason.TOO_LARGE or not fits_empty, r.detail
        now += 1.0
