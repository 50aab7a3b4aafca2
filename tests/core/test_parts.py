"""Each part of the accelmux policy alone: built over a fake view of plain data and a
recording ops (``part_doubles``), with the parts it takes built the same way or doubled.
What a part is asked and what it asks the world to do is all a test sees."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from accelmux.core.events import Demand
from accelmux.core.policies.accelmux.admission import Admission
from accelmux.core.policies.accelmux.learning import Learning
from accelmux.core.policies.accelmux.loading import Loading
from accelmux.core.policies.accelmux.preemption import Preemption
from accelmux.core.policies.accelmux.records import RoomFor, Round
from accelmux.core.policies.accelmux.reserve import Reserve
from accelmux.core.policies.accelmux.residency import Residents
from accelmux.core.policies.accelmux.room import Room
from accelmux.core.policies.accelmux.routing import Routing
from accelmux.core.policies.accelmux.schedule import Schedule
from accelmux.core.policies.accelmux.shrinking import Shrinking
from accelmux.core.policies.accelmux.steady import Steady
from accelmux.core.policies.accelmux.time_sharing import TimeSharing
from accelmux.core.policies.accelmux.wakeup import Wakeup
from accelmux.core.specs import Capabilities, ManagerSpec, PolicyKnobs, ServiceSpec
from accelmux.core.types import (
    GIB,
    MIB,
    Reason,
    Residency,
    ServiceClass,
    ServiceKind,
    ServiceStatus,
)
from accelmux.core.world import RequestState

from .part_doubles import FakeView, RecordingOps, seam
from .support import device, llm_profile, plain_profile, service

RT, IA, BA = ServiceClass.REALTIME, ServiceClass.INTERACTIVE, ServiceClass.BATCH
PAUSING = Capabilities(pause=True, park=True)


def view_of(*services: ServiceSpec, **knobs: Any) -> FakeView:
    spec = ManagerSpec(
        devices=(device(budget=12 * GIB, headroom=0),),
        services=services,
        knobs=PolicyKnobs(prewarm=False, safety_factor=1.0, **knobs),
    )
    return FakeView(spec)


def chat(name: str, **kw: Any) -> ServiceSpec:
    spec = service(name, kind=ServiceKind.CHAT, profile=llm_profile(), **kw)
    return replace(spec, capabilities=PAUSING)


def parts(view: FakeView, ops: RecordingOps) -> tuple[TimeSharing, Room, Reserve]:
    s = seam(view, ops)
    ts = TimeSharing(s)
    return ts, Room(s, Preemption(s, ts), ts), Reserve(s)


# ---- TimeSharing ----------------------------------------------------------------------
def test_a_new_request_at_the_concurrency_limit_pauses_the_longest_stream() -> None:
    view = view_of(chat("chat"))
    svc = view.set_status("chat", ServiceStatus.LOADED)
    older = view.add_request("r1", "chat", running=True, since=0.0)
    view.add_request("r2", "chat", running=True, since=5.0)
    older.pausable = True
    view.services["chat"].inflight["r2"].pausable = True
    new = view.add_request("r3", "chat")
    view.now = 10.0
    ops = RecordingOps()
    assert TimeSharing(seam(view, ops)).pause_for_first_token(svc, new)
    ((args, kwargs),) = ops.named("pause")
    assert args == (older,) and kwargs["reason"] is Reason.TIME_SHARE
    assert kwargs["detail"] == "first token of r3"


def test_no_stream_is_paused_with_the_first_token_pause_off() -> None:
    view = view_of(chat("chat"), disabled=frozenset({"first_token_pause"}))
    svc = view.set_status("chat", ServiceStatus.LOADED)
    view.add_request("r1", "chat", running=True, since=0.0).pausable = True
    view.now = 10.0
    ops = RecordingOps()
    assert not TimeSharing(seam(view, ops)).pause_for_first_token(
        svc, view.add_request("r2", "chat")
    )
    assert ops.calls == []


def test_realtime_work_pauses_interactive_streams_on_its_device() -> None:
    view = view_of(chat("chat"), service("asr", cls=RT))
    view.set_status("chat", ServiceStatus.LOADED)
    view.set_status("asr", ServiceStatus.LOADED)
    stream = view.add_request("c1", "chat", running=True, since=0.0)
    stream.pausable = True
    view.add_request("a1", "asr")  # realtime work waits
    view.now = 5.0
    ops = RecordingOps()
    ts = TimeSharing(seam(view, ops))
    ts.yield_to_realtime()
    ((args, kwargs),) = ops.named("pause")
    assert args == (stream,) and kwargs["for_realtime"] is True
    assert ts.yielded_realtime == {"c1"}


# ---- Preemption -----------------------------------------------------------------------
def test_a_stop_parks_a_stream_its_backend_can_pause_and_notes_for_whom() -> None:
    view = view_of(chat("chat"), chat("other"))
    view.set_status("chat", ServiceStatus.LOADED)
    running = view.add_request("c1", "chat", running=True)
    requester = view.add_request("o1", "other")
    ops = RecordingOps()
    s = seam(view, ops)
    ts = TimeSharing(s)
    Preemption(s, ts).stop(running, IA, requester)
    assert ops.names() == ["pause"]
    assert ops.named("pause")[0][1]["park"] is True
    assert ts.yielded_to == {"c1": "o1"}


def test_a_stop_preempts_work_whose_backend_cannot_pause() -> None:
    view = view_of(service("job", cls=BA))
    view.set_status("job", ServiceStatus.LOADED)
    running = view.add_request("j1", "job", running=True)
    ops = RecordingOps()
    s = seam(view, ops)
    Preemption(s, TimeSharing(s)).stop(running, IA, None)
    ((args, kwargs),) = ops.named("preempt")
    assert args == (running,) and kwargs["reason"] is Reason.PREEMPTED_FOR_HIGHER_CLASS


# ---- Room -----------------------------------------------------------------------------
def test_a_plan_for_free_memory_has_no_steps_and_fits() -> None:
    view = view_of(service("a"))
    view.ledger.free["gpu"] = 2 * GIB
    ops = RecordingOps()
    _, room, _ = parts(view, ops)
    plan = room.plan("gpu", GIB, RoomFor(IA, None))
    assert plan is not None and plan.survey is None
    assert room.apply(plan) and ops.calls == []


def test_room_evicts_the_cheapest_single_victim_that_covers_the_need() -> None:
    view = view_of(
        service("warm", residency=Residency.WARM, profile=plain_profile(weights=3 * GIB)),
        service("od", residency=Residency.ON_DEMAND, profile=plain_profile(weights=3 * GIB)),
        service("new"),
    )
    for name in ("warm", "od"):
        view.set_status(name, ServiceStatus.LOADED)
        view.hold(name, 3 * GIB)
    ops = RecordingOps()
    _, room, _ = parts(view, ops)
    plan = room.plan("gpu", 2 * GIB, RoomFor(IA, view.services["new"]))
    assert plan is not None and plan.survey is not None
    assert [s.name for s in plan.survey.victims] == ["od", "warm"]  # on-demand scores lower
    assert not room.apply(plan)  # the memory comes back with the unload
    ((args, kwargs),) = ops.named("unload")
    assert args[0].name == "od" and kwargs["reason"] is Reason.EVICTED_FOR_MEMORY


def test_no_plan_when_only_kept_services_hold_the_memory_and_the_failure_is_kept() -> None:
    view = view_of(service("pin", residency=Residency.PINNED), service("new"))
    view.set_status("pin", ServiceStatus.LOADED)
    view.hold("pin", 8 * GIB)
    ops = RecordingOps()
    _, room, _ = parts(view, ops)
    for_ = RoomFor(IA, view.services["new"])
    assert room.plan("gpu", GIB, for_) is None
    assert len(room.cache.room_failed) == 1  # a larger need is answered without a survey
    view.services["pin"].pinned = False  # (a survey now would find it)
    assert room.plan("gpu", 2 * GIB, for_) is None
    assert ops.calls == []


# ---- Reserve and Steady ---------------------------------------------------------------
def test_the_realtime_reserve_keeps_each_loaded_realtime_services_next_activations() -> None:
    view = view_of(service("asr", cls=RT, concurrency=2), service("tts", cls=RT))
    asr = view.set_status("asr", ServiceStatus.LOADED)
    _, _, reserve = parts(view, RecordingOps())
    typical = asr.calibration.active.project(asr.spec.profile.workspace)
    assert reserve.realtime_reserve("gpu") == 2 * typical  # tts is not loaded
    view.learned.realtime_peak["asr"] = 300 * MIB
    view.learned.realtime_peak_changes += 1
    view.version += 1
    assert reserve.realtime_reserve("gpu") == 2 * 300 * MIB


def test_a_reserve_that_would_keep_work_out_for_good_falls_back_to_one_activation() -> None:
    view = view_of(service("asr", cls=RT, concurrency=2), service("img"))
    view.set_status("asr", ServiceStatus.LOADED)
    view.learned.realtime_peak["asr"] = GIB
    _, _, reserve = parts(view, RecordingOps())
    img = view.services["img"]
    assert reserve.fitting_reserve(img, need=GIB, limit=10 * GIB) == 2 * GIB
    assert reserve.fitting_reserve(img, need=9 * GIB, limit=10 * GIB) == GIB


def test_a_batch_load_leaves_the_next_frame_of_a_steady_service_free() -> None:
    camera = replace(service("camera", cls=ServiceClass.BACKGROUND), steady=True)
    view = view_of(camera, service("job", cls=BA))
    cam = view.set_status("camera", ServiceStatus.LOADED)
    steady = Steady(seam(view))
    frame = cam.calibration.active.project(cam.spec.profile.workspace)
    job = view.services["job"]
    assert steady.steady_reserve(job, need=GIB, limit=10 * GIB) == frame
    assert steady.steady_reserve(job, need=10 * GIB, limit=10 * GIB) == 0  # never both


# ---- Routing --------------------------------------------------------------------------
def test_a_request_goes_to_the_loaded_replica_with_a_free_slot() -> None:
    spec = ManagerSpec(
        devices=(device("gpu", headroom=0), device("gpu2", headroom=0)),
        services=(
            replace(service("emb@gpu"), group="emb"),
            replace(service("emb@gpu2", device_name="gpu2"), group="emb"),
        ),
        knobs=PolicyKnobs(prewarm=False),
    )
    view = FakeView(spec)
    view.set_status("emb@gpu2", ServiceStatus.LOADED)
    view.ledger.free.update(gpu=10 * GIB, gpu2=GIB)
    ops = RecordingOps()
    _, room, reserve = parts(view, ops)
    routing = Routing(seam(view, ops), room, reserve)
    assert routing.route(view.groups["emb"], Demand()).name == "emb@gpu2"


# ---- Loading and Admission ------------------------------------------------------------
def test_a_request_for_an_unloaded_service_loads_it_when_its_room_is_free() -> None:
    view = view_of(service("img"))
    view.ledger.free["gpu"] = 10 * GIB
    req = view.add_request("r1", "img")
    ops = RecordingOps()
    s = seam(view, ops)
    _, room, reserve = parts(view, ops)
    Loading(s, room, reserve, Steady(s)).load_for(req, view.services["img"], Round(), False)
    assert ops.names() == ["load", "enqueue"]
    assert ops.named("load")[0][1]["reason"] is Reason.DEMAND
    assert ops.named("enqueue")[0][1] == {"reason": Reason.LOADING, "detail": "cold start"}


def admission(view: FakeView, ops: RecordingOps) -> Admission:
    s = seam(view, ops)
    ts, room, reserve = parts(view, ops)
    return Admission(s, room, reserve, Loading(s, room, reserve, Steady(s)), ts, Shrinking(s))


def test_a_request_for_a_loaded_idle_service_with_room_is_dispatched() -> None:
    view = view_of(service("img"))
    view.set_status("img", ServiceStatus.LOADED)
    view.ledger.free["gpu"] = 10 * GIB
    req = view.add_request("r1", "img", demand=Demand(units=1.0))
    ops = RecordingOps()
    admission(view, ops).consider(req, Round())
    ((args, kwargs),) = ops.named("dispatch")
    assert args == (req,) and kwargs["reason"] is Reason.FITS


def test_a_request_at_its_services_concurrency_waits_with_that_reason() -> None:
    view = view_of(service("img"))
    view.set_status("img", ServiceStatus.LOADED)
    view.ledger.free["gpu"] = 10 * GIB
    view.add_request("r1", "img", running=True)
    req = view.add_request("r2", "img")
    ops = RecordingOps()
    admission(view, ops).consider(req, Round())
    ((args, kwargs),) = ops.named("enqueue")
    assert args == (req,) and kwargs["reason"] is Reason.CONCURRENCY_LIMIT


def test_batch_work_waits_while_realtime_work_runs_on_its_device() -> None:
    view = view_of(service("job", cls=BA))
    view.set_status("job", ServiceStatus.LOADED)
    view.ledger.free["gpu"] = 10 * GIB
    req = view.add_request("j1", "job")
    ops = RecordingOps()
    admission(view, ops).consider(req, Round(realtime_active={"gpu"}))
    ((_, kwargs),) = ops.named("enqueue")
    assert kwargs["reason"] is Reason.HIGHER_CLASS_WAITING


# ---- Schedule ------------------------------------------------------------------------
class ConsideredInOrder:
    """A double of Admission: it notes the requests it is asked to consider."""

    def __init__(self) -> None:
        self.considered: list[str] = []

    def consider(self, req: RequestState, rnd: Round) -> None:
        self.considered.append(req.request_id)


def test_a_round_considers_waiting_requests_in_class_then_arrival_order() -> None:
    view = view_of(service("job", cls=BA), service("img"), service("asr", cls=RT))
    for rid, svc in (("j1", "job"), ("i1", "img"), ("a1", "asr"), ("i2", "img")):
        view.add_request(rid, svc)
    ops = RecordingOps()
    s = seam(view, ops)
    double = ConsideredInOrder()
    Schedule(s, double, TimeSharing(s)).schedule()  # type: ignore[arg-type]
    assert double.considered == ["a1", "i1", "i2", "j1"]
    assert [a[0].request_id for a, _ in ops.named("mark_announced")] == double.considered


# ---- Residents, Learning, Wakeup ------------------------------------------------------
def residents(view: FakeView, ops: RecordingOps) -> Residents:
    s = seam(view, ops)
    _, room, reserve = parts(view, ops)
    loading = Loading(s, room, reserve, Steady(s))
    return Residents(s, room, reserve, loading, Routing(s, room, reserve))


def test_an_idle_service_past_its_ttl_unloads_when_memory_is_not_spare() -> None:
    view = view_of(service("img", ttl_s=30.0), service("busy", ttl_s=30.0))
    view.set_status("img", ServiceStatus.LOADED).last_used = 0.0
    view.set_status("busy", ServiceStatus.LOADED)
    view.add_request("b1", "busy", running=True)
    view.now = 100.0
    ops = RecordingOps()
    residents(view, ops).expire_idle()
    ((args, kwargs),) = ops.named("unload")
    assert args[0].name == "img" and kwargs["reason"] is Reason.TTL_EXPIRED


def test_an_idle_service_stays_while_its_device_has_memory_to_spare() -> None:
    view = view_of(service("img", ttl_s=30.0))
    view.set_status("img", ServiceStatus.LOADED).last_used = 0.0
    view.ledger.free["gpu"] = 10 * GIB
    view.now = 100.0
    ops = RecordingOps()
    residents(view, ops).expire_idle()
    assert ops.calls == []


def test_a_charged_service_gives_back_its_own_work_first_under_pressure() -> None:
    view = view_of(service("job", cls=BA), service("img"))
    view.set_status("job", ServiceStatus.LOADED)
    view.set_status("img", ServiceStatus.LOADED)
    running = view.add_request("j1", "job", running=True)
    view.add_request("i1", "img", running=True)
    view.learned.charged["job"] = 2 * GIB
    view.ledger.free["gpu"] = -GIB
    ops = RecordingOps()
    s = seam(view, ops)
    _, room, _ = parts(view, ops)
    Learning(s, room).relieve_pressure()
    ((args, kwargs),) = ops.named("preempt")
    assert args == (running,) and kwargs["reason"] is Reason.OVER_ESTIMATE


def test_the_next_wake_up_is_an_idle_services_ttl() -> None:
    view = view_of(service("img", ttl_s=30.0))
    view.set_status("img", ServiceStatus.LOADED).last_used = 2.0
    view.now = 5.0
    ops = RecordingOps()
    wakeup = Wakeup(seam(view, ops), residents(view, ops))
    assert wakeup.next_wakeup(5.0) == 32.0
    assert ops.calls == []  # a wake-up only reads
