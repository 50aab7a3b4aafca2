"""A steady (camera) service ranks above batch when room is made (``room_rank``): its load
takes its memory back from batch work, its frames evict idle batch services, a batch
load leaves its next frame free, and realtime work holds its frames back only where they
share compute (a host device). Batch work still never takes a steady service's memory nor
stops its frames."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accelmux.core.actions import Preempt
from accelmux.core.events import Tick, Unloaded
from accelmux.core.manager import Manager
from accelmux.core.policies.accelmux import AccelmuxPolicy
from accelmux.core.policies.accelmux.heuristics import TUNING
from accelmux.core.specs import ManagerSpec, MemoryProfile, ServiceSpec, ranks_below, room_rank
from accelmux.core.types import GIB, MIB, Reason, ServiceClass, ServiceKind

from .support import (
    EXACT,
    arrive,
    device,
    dispatched,
    done,
    enqueued,
    loads,
    manager,
    of,
    plain_profile,
    service,
    unloads,
    up,
)
from .test_indexes import drive
from .test_properties import SETTINGS, Op, manager_specs, ops_strategy

RT, IA, BA, BG = (
    ServiceClass.REALTIME,
    ServiceClass.INTERACTIVE,
    ServiceClass.BATCH,
    ServiceClass.BACKGROUND,
)


def _gib(weights: float, workspace: float = 0, per_unit: float = 0) -> MemoryProfile:
    return plain_profile(
        weights=int(weights * GIB), workspace=int(workspace * GIB), per_unit=per_unit * GIB
    )


def _camera(steady: bool, profile: MemoryProfile) -> ServiceSpec:
    return replace(service("cam", cls=BG, profile=profile, kind=ServiceKind.DETECT), steady=steady)


def _index(profile: MemoryProfile) -> ServiceSpec:
    return service("idx", cls=BA, profile=profile, kind=ServiceKind.EMBEDDINGS)


def test_the_rank_puts_steady_work_between_interactive_and_batch() -> None:
    order = [
        room_rank(RT, steady=False),
        room_rank(IA, steady=False),
        room_rank(BG, steady=True),
        room_rank(BA, steady=False),
        room_rank(BG, steady=False),
    ]
    assert order == sorted(order) and len(set(order)) == len(order)
    assert room_rank(BA, steady=True) == room_rank(BG, steady=True)
    # steadiness changes nothing above batch: without steady services, the classes' order
    assert [room_rank(c, steady=True) for c in (RT, IA)] == [int(RT), int(IA)]
    cam = _camera(True, _gib(1))
    assert ranks_below(cam, IA, steady=False) and not ranks_below(cam, BA, steady=False)
    assert ranks_below(_index(_gib(1)), BG, steady=True)


def test_a_steady_services_load_evicts_idle_batch_and_gets_its_memory() -> None:
    def first_moves(steady: bool) -> tuple[list[str], Reason | None, list[str]]:
        m = manager(_camera(steady, _gib(6)), _index(_gib(7)), knobs=EXACT)
        up(m, "idx")  # the window's batch model holds the memory; the detector is out
        out = m.handle(arrive("c1", "cam"), 1.0)
        waiting = enqueued(out).get("c1")
        evicted = [u.service for u in unloads(out)]
        after = m.handle(Unloaded(service="idx"), 1.5) if evicted else []
        return evicted, waiting.reason if waiting else None, [a.service for a in loads(after)]

    assert first_moves(steady=True)[0] == ["idx"]
    assert first_moves(steady=True)[2] == ["cam"]  # the detector loads once it is out
    assert first_moves(steady=False) == ([], Reason.NO_MEMORY, [])  # batch outranks it


def test_a_steady_services_load_stops_running_batch_work() -> None:
    def stopped(steady: bool) -> tuple[list[str], list[str]]:
        m = manager(_camera(steady, _gib(6)), _index(_gib(7)), knobs=EXACT)
        up(m, "idx")
        assert dispatched(m.handle(arrive("x1", "idx"), 1.0)) == ["x1"]
        out = m.handle(arrive("c1", "cam"), 2.0)
        return [p.request_id for p in of(Preempt, out)], [u.service for u in unloads(out)]

    assert stopped(steady=True) == (["x1"], ["idx"])
    assert stopped(steady=False) == ([], [])


def test_a_loaded_steady_services_frames_do_not_stop_batch_work() -> None:
    m = manager(_camera(True, _gib(1, 1)), _index(_gib(4, per_unit=1)), knobs=EXACT)
    up(m, "cam", "idx")
    assert dispatched(m.handle(arrive("x1", "idx", units=6), 1.0)) == ["x1"]
    out = m.handle(arrive("c1", "cam"), 2.0)
    # a stopped job on a caching backend unloads its model: a frame a second would
    # unload it every second. The frame waits for the job instead.
    assert of(Preempt, out) == [] and unloads(out) == []
    assert enqueued(out)["c1"].reason is Reason.NO_MEMORY
    assert dispatched(m.handle(done("x1"), 3.0)) == ["c1"]


def test_a_batch_load_leaves_a_steady_services_next_frame_free() -> None:
    def idx_moves(steady: bool) -> tuple[list[str], Reason | None]:
        m = manager(_camera(steady, _gib(1, 1)), _index(_gib(9.8)), knobs=EXACT)
        up(m, "cam")  # 10.5 GiB free; the batch model and a frame need 10.8
        out = m.handle(arrive("x1", "idx"), 1.0)
        waiting = enqueued(out).get("x1")
        return [a.service for a in loads(out)], waiting.reason if waiting else None

    assert idx_moves(steady=True) == ([], Reason.NO_MEMORY)
    assert idx_moves(steady=False)[0] == ["idx"]


def _frame_beside_voice(steady: bool, kind: str) -> tuple[list[str], Reason | None, Manager]:
    """A frame of a camera service arriving while a voice request runs on a device of
    ``kind`` (``host``: shared compute; ``virtual``: a discrete accelerator)."""
    m = manager(
        service("asr", cls=RT, profile=_gib(1, 0.5), kind=ServiceKind.ASR),
        _camera(steady, _gib(1, 0.25)),
        devices=(replace(device(), kind=kind),),
        knobs=EXACT,
    )
    up(m, "cam", "asr")  # the camera first: asr's warm-up holds it for the grace
    assert dispatched(m.handle(arrive("v1", "asr"), 1.0)) == ["v1"]
    out = m.handle(arrive("c1", "cam"), 1.1)
    waiting = enqueued(out).get("c1")
    return dispatched(out), waiting.reason if waiting else None, m


def test_realtime_work_holds_frames_back_only_where_it_shares_compute() -> None:
    # a discrete accelerator: a frame takes little beside a voice request, and its
    # deadline is a second or so
    assert _frame_beside_voice(True, "virtual")[:2] == (["c1"], None)
    assert _frame_beside_voice(False, "virtual")[:2] == ([], Reason.HIGHER_CLASS_WAITING)
    # shared compute (a host device): the frame yields to the voice request, is counted,
    # and runs once it ends and the grace for the chain's next step has passed
    out, reason, m = _frame_beside_voice(True, "host")
    assert (out, reason) == ([], Reason.HIGHER_CLASS_WAITING)
    assert (m.explain("c1") or [""])[-1].endswith("realtime work running")
    row = next(r for r in m.snapshot().as_dict()["services"] if r["name"] == "cam")
    assert (row["held_for_realtime"], row["skipped_for_realtime"]) == (1, 0)
    assert dispatched(m.handle(done("v1"), 1.5)) == []
    assert m.next_wakeup(1.5) == 1.5 + TUNING.host_realtime_grace_s
    assert dispatched(m.handle(Tick(), 1.5 + TUNING.host_realtime_grace_s)) == ["c1"]


def test_a_frame_held_past_its_deadline_counts_as_skipped() -> None:
    _, _, m = _frame_beside_voice(True, "host")
    m.handle(Tick(), 40.0)  # past the frame's deadline, the voice request still running
    row = next(r for r in m.snapshot().as_dict()["services"] if r["name"] == "cam")
    assert (row["held_for_realtime"], row["skipped_for_realtime"]) == (1, 1)


sizes = st.floats(min_value=0.25, max_value=5.0).map(lambda g: round(g * 4) / 4)


@settings(max_examples=60, deadline=None)
@given(cam=sizes, frame=sizes, idx=sizes, busy=st.booleans())
def test_a_steady_load_never_waits_behind_batch_memory(
    cam: float, frame: float, idx: float, busy: bool
) -> None:
    """Whatever the sizes, a steady service that fits the device alone, arriving to find
    batch work holding its memory, evicts (and if need be stops) it: it never waits for
    memory while the batch model stays loaded."""
    m = manager(_camera(True, _gib(cam, frame)), _index(_gib(idx, 0.25)), knobs=EXACT)
    up(m, "idx")
    if busy:
        assert dispatched(m.handle(arrive("x1", "idx"), 1.0)) == ["x1"]
    out = m.handle(arrive("c1", "cam"), 2.0)
    if [a.service for a in loads(out)] == ["cam"]:
        return  # it fit beside the batch model
    assert [u.service for u in unloads(out)] == ["idx"]
    assert [p.request_id for p in of(Preempt, out)] == (["x1"] if busy else [])


@settings(max_examples=60, deadline=None)
@given(
    cam=sizes,
    frame=sizes,
    idx=sizes,
    units=st.lists(st.integers(min_value=0, max_value=8), min_size=1, max_size=6),
)
def test_batch_work_never_evicts_nor_stops_a_steady_service(
    cam: float, frame: float, idx: float, units: list[int]
) -> None:
    """Whatever batch work arrives, a loaded steady service and its running frame stay."""
    m = manager(
        _camera(True, _gib(cam, frame)), _index(_gib(idx, 0.1, per_unit=MIB / GIB * 512)),
        knobs=EXACT,
    )  # fmt: skip
    up(m, "cam")
    assert dispatched(m.handle(arrive("c1", "cam"), 1.0)) == ["c1"]
    for i, u in enumerate(units):
        out = m.handle(arrive(f"x{i}", "idx", units=u), 2.0 + i)
        assert "cam" not in [a.service for a in unloads(out)]
        assert "c1" not in [p.request_id for p in of(Preempt, out)]


@pytest.mark.slow
@SETTINGS
@given(spec=manager_specs(), ops=ops_strategy, steady=st.lists(st.booleans(), min_size=12))
def test_the_short_queue_path_and_the_skipping_path_order_steady_work_alike(
    spec: ManagerSpec, ops: list[Op], steady: list[bool]
) -> None:
    """With steady services among the others, the round that sorts every waiting request
    by rank (a short queue) and the one that takes them turn by turn (skipping what would
    repeat) decide alike."""
    spec = replace(
        spec,
        services=tuple(replace(s, steady=f) for s, f in zip(spec.services, steady, strict=False)),
    )
    sorting = AccelmuxPolicy()
    sorting.few_waiting = 10**9  # every round sorts every waiting request
    skipping = AccelmuxPolicy()
    skipping.few_waiting = 0  # every round goes turn by turn, skipping what it can
    a, b = drive(spec, sorting, ops, check=False), drive(spec, skipping, ops, check=False)
    assert a.actions == b.actions
