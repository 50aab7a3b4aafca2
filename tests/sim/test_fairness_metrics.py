"""Simulator metrics of fairness: starvation per class, undone batch documents as misses."""

from __future__ import annotations

from pathlib import Path

from tests.sim.support import scenario, tiny

from accelmux.core.events import Demand, LoadFinished, RequestArrived
from accelmux.core.manager import Manager
from accelmux.core.policies import make_policy
from accelmux.core.types import GIB
from accelmux.sim.executor import Simulation
from accelmux.sim.metrics import summarize
from accelmux.sim.starvation import StarvationTracker


def _waiting_chat(tmp_path: Path) -> Manager:
    spec = scenario(tmp_path).manager_spec()
    m = Manager(spec, make_policy("accelmux"))
    m.start(0.0)
    m.handle(RequestArrived(request_id="c1", service="chat", demand=Demand(kv_tokens=100)), 0.0)
    assert "c1" in m.world.waiting  # chat is loading
    return m


def test_a_class_waiting_while_its_request_fits_in_idle_memory_is_starved(
    tmp_path: Path,
) -> None:
    m = _waiting_chat(tmp_path)
    tracker = StarvationTracker()
    for _ in range(3):
        tracker.sample(m.world, {"gpu": 8 * GIB}, 1.0)
    tracker.sample(m.world, {"gpu": 0}, 1.0)  # no idle memory: not starved
    tracker.sample(m.world, {"gpu": 8 * GIB}, 1.0)
    report = tracker.as_dict()
    assert report["interactive"] == {"starved_s": 4.0, "longest_starved_s": 3.0}
    assert report["realtime"] == {"starved_s": 0.0, "longest_starved_s": 0.0}


def test_a_class_with_work_running_is_not_starved(tmp_path: Path) -> None:
    m = _waiting_chat(tmp_path)
    m.handle(LoadFinished(service="chat"), 1.0)
    for rid in ("c2", "c3"):  # concurrency 2: c3 waits while c1 and c2 run
        m.handle(RequestArrived(request_id=rid, service="chat", demand=Demand(kv_tokens=100)), 1.0)
    assert "c3" in m.world.waiting and len(m.world.inflight) == 2
    tracker = StarvationTracker()
    tracker.sample(m.world, {"gpu": 8 * GIB}, 1.0)
    assert tracker.as_dict()["interactive"]["starved_s"] == 0.0


def test_undone_batch_documents_are_misses(tmp_path: Path) -> None:
    data = tiny()
    data["services"]["embed"] = {
        "kind": "embeddings",
        "class": "batch",
        "residency": "warm",
        "memory": {"weights": "128MiB", "workspace": "64MiB", "per_unit": "1MiB"},
        "queue": {"limit": 64, "deadline_s": 600},
        "slo": {"latency_s": 60},
    }
    data["simulation"]["services"]["embed"] = {"share": 0.5, "per_unit_s": 0.5}
    # 400 documents of ~10 s each, 2 outstanding: far more than 600 s can hold.
    data["workloads"].append(
        {
            "type": "indexing",
            "service": "embed",
            "documents": 400,
            "outstanding": 2,
            "units": 20,
        }
    )
    report = summarize(Simulation(scenario(tmp_path, data), "accelmux", 0).run())
    batch = report["classes"]["batch"]
    job = report["batch"]["jobs"][0]
    undone = job["documents"] - job["done"]
    assert undone > 300
    assert batch["undone"] >= undone - 2  # (at most the open ones were counted already)
    assert batch["slo_attainment"] < 0.25
