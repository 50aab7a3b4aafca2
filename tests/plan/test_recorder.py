"""The recorder: one row per request, from the Manager's rounds and the stream timer."""

from __future__ import annotations

from typing import Any

from accelmux.core.actions import Dispatch, Enqueue, Load, Pause, Reject
from accelmux.core.events import (
    Demand,
    LoadFinished,
    RequestArrived,
    RequestCancelled,
    RequestFinished,
)
from accelmux.core.specs import DeviceSpec, ManagerSpec, MemoryProfile, ServiceSpec
from accelmux.core.types import GIB, Reason, Residency, ServiceClass, ServiceKind
from accelmux.history.recorder import HistoryRecorder, StreamFigures
from accelmux.history.records import DaemonRun, LoadRecord, RequestRecord

SPEC = ManagerSpec(
    devices=(
        DeviceSpec(
            name="gpu",
            kind="virtual",
            capacity_bytes=8 * GIB,
            budget_bytes=8 * GIB,
            headroom_bytes=GIB // 2,
        ),
    ),
    services=(
        ServiceSpec(
            name="chat",
            kind=ServiceKind.CHAT,
            cls=ServiceClass.INTERACTIVE,
            residency=Residency.WARM,
            device="gpu",
            profile=MemoryProfile(weights=GIB, kv_bytes_per_token=1024, kv_ceiling=GIB),
        ),
    ),
)


class Rows:
    def __init__(self) -> None:
        self.rows: list[Any] = []

    def write(self, rows: Any) -> None:
        self.rows += rows


def recorder(figures: dict[str, StreamFigures]) -> tuple[HistoryRecorder, Rows]:
    rows = Rows()
    run = DaemonRun("s", 0.0, "t", "{}", "{}")
    return HistoryRecorder(rows, SPEC, run, stream_figures=figures.get), rows


def arrive(rec: HistoryRecorder, t: float, rid: str) -> None:
    demand = Demand(kv_tokens=300, prompt_tokens=100, output_tokens=200)
    rec.round(t, RequestArrived(request_id=rid, service="chat", demand=demand, pausable=True), [])


def dispatch(rid: str, attempt: int = 1) -> Dispatch:
    return Dispatch(
        request_id=rid, service="chat", attempt=attempt, lease_bytes=1, reason=Reason.FITS
    )


def test_a_request_row_follows_the_request_through_its_rounds() -> None:
    rec, rows = recorder({"req-1": StreamFigures(first_chunk_at=1.5, output_tokens=42)})
    arrive(rec, 1.0, "req-1")
    rec.round(1.0, None, [Enqueue(request_id="req-1", service="chat", reason=Reason.LOADING)])
    rec.round(1.1, None, [Enqueue(request_id="req-1", service="chat", reason=Reason.NO_MEMORY)])
    rec.round(1.2, None, [dispatch("req-1")])
    rec.round(
        1.3,
        None,
        [
            Pause(
                request_id="req-1", service="chat", attempt=1, park=False, reason=Reason.TIME_SHARE
            )
        ],
    )
    rec.round(2.0, RequestFinished(request_id="req-1", attempt=1, peak_bytes=123), [])
    rec.flush()
    (row,) = [r for r in rows.rows if isinstance(r, RequestRecord)]
    assert (row.t_arrived, row.t_dispatched, row.t_first_token, row.t_finished) == (
        1.0,
        1.2,
        1.5,
        2.0,
    )
    assert row.first_wait == "loading" and row.pauses == 1 and row.peak_bytes == 123
    assert (row.prompt_tokens, row.max_output_tokens, row.output_tokens) == (100, 200, 42)
    assert row.outcome == "ok" and row.stream == 1 and row.cls == "interactive"


def test_a_stream_whose_end_went_out_is_served_even_if_the_client_hung_up_first() -> None:
    done = StreamFigures(first_chunk_at=1.5, output_tokens=8, last_chunk_at=1.9, completed=True)
    cut = StreamFigures(first_chunk_at=1.5, output_tokens=3, last_chunk_at=1.7, completed=False)
    rec, rows = recorder({"req-1": done, "req-2": cut})
    for rid in ("req-1", "req-2"):
        arrive(rec, 1.0, rid)
        rec.round(1.1, None, [dispatch(rid)])
        rec.round(2.5, RequestCancelled(request_id=rid), [])
    rec.flush()
    served, gone = [r for r in rows.rows if isinstance(r, RequestRecord)]
    assert served.outcome == "ok" and served.t_finished == 1.9
    assert gone.outcome == "cancelled" and gone.t_finished == 2.5


def test_a_stale_answer_a_rejection_and_a_load() -> None:
    rec, rows = recorder({})
    arrive(rec, 0.0, "req-1")
    rec.round(0.1, None, [dispatch("req-1", attempt=2)])
    rec.round(0.2, RequestFinished(request_id="req-1", attempt=1), [])  # the preempted run's
    arrive(rec, 0.3, "req-2")
    rec.round(
        0.3,
        None,
        [Reject(request_id="req-2", service="chat", reason=Reason.QUEUE_FULL, retry_after_s=1)],
    )
    rec.round(
        0.4, None, [Load(service="chat", reason=Reason.DEMAND, weights_bytes=1, runtime_bytes=1)]
    )
    rec.round(1.4, LoadFinished(service="chat", weights_bytes=5, runtime_bytes=6), [])
    rec.close(2.0)
    requests = {r.request_id: r for r in rows.rows if isinstance(r, RequestRecord)}
    assert requests["req-1"].outcome == "open"  # its answer was stale: still running
    assert requests["req-2"].outcome == "rejected" and requests["req-2"].reason == "queue_full"
    (load,) = [r for r in rows.rows if isinstance(r, LoadRecord)]
    assert (load.t_start, load.t_end, load.weights, load.ok) == (0.4, 1.4, 5, 1)
