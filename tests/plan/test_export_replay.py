"""A history exported and replayed: the trace, the links, the timeline, the calibration,
and the replay of a history the simulator itself recorded, which must give it back."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from tests.plan.support import home, record

from accelmux.history.records import RequestRecord, SampleRecord
from accelmux.history.store import read_history
from accelmux.plan.calibrate import calibrate, nnls
from accelmux.plan.compare import compare
from accelmux.plan.export import LINK_GAP_S, export_history, link, timeline
from accelmux.plan.outcomes import from_trace, slo_table
from accelmux.plan.replay import replay
from accelmux.sim.recorded import RecordedError, read_timeline, read_trace, write_trace
from accelmux.sim.scenario import load_scenario


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record(home(), tmp_path_factory.mktemp("home"))


def req(
    i: int, t: float, end: float | None, *, origin: str = "http", service: str = "asr"
) -> RequestRecord:
    return RequestRecord(
        run="s",
        request_id=f"r{i}",
        service=service,
        replica=service,
        cls="realtime",
        kind="asr",
        origin=origin,
        t_arrived=t,
        t_dispatched=t,
        t_finished=end,
        outcome="ok",
    )


def test_a_request_sent_as_soon_as_another_ended_follows_it() -> None:
    requests = [
        req(0, 0.0, 1.0),  # ASR
        req(1, 1.0 + LINK_GAP_S / 2, 2.0, service="chat"),  # the chat step right after
        req(2, 2.01, 3.0, service="tts"),  # then TTS
        req(3, 2.5, 2.9, origin="job", service="embed"),  # another origin: never linked
        req(4, 3.0 + 2 * LINK_GAP_S, 4.0),  # came later than the gap: not linked
    ]
    assert link(requests) == {1: (0, pytest.approx(LINK_GAP_S / 2)), 2: (1, pytest.approx(0.01))}


def test_one_earlier_request_has_at_most_one_follower() -> None:
    requests = [req(0, 0.0, 1.0), req(1, 1.01, 2.0), req(2, 1.02, 2.0)]
    assert list(link(requests)) == [1]


def test_the_timeline_keeps_only_what_moved() -> None:
    def sample(t: float, used: int, cpu: float | None) -> SampleRecord:
        return SampleRecord("s", t, "gpu", used, 100, 10, 0, "{}", 0.1 if cpu else None, cpu)

    rows = timeline(
        [
            sample(1, 1000, None),
            sample(2, 1001, None),
            sample(3, 10 * 2**20, 0.5),
            sample(4, 10 * 2**20, 0.5),
        ],
        0.0,
    )
    # the compute a sample measured holds over its span: from the sample before it on
    assert [(r.t_s, r.foreign_compute) for r in rows] == [(1, None), (2, 0.4), (3, 0.4)]
    assert rows[2].other_bytes == 10 * 2**20 - 100


def test_nnls_recovers_non_negative_coefficients() -> None:
    rows = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 1.0]]
    assert nnls(rows, [0.5 * a + 0.25 * b for a, b in rows]) == pytest.approx([0.5, 0.25], abs=1e-6)
    assert nnls(rows, [-1.0 * a + 0.5 * b for a, b in rows])[0] == 0.0


def test_calibration_reads_the_profile_the_history_was_made_with(recorded: Path) -> None:
    profiles = calibrate(read_history(recorded))
    assert profiles["asr"].share == pytest.approx(0.5, abs=0.05)
    assert profiles["embed"].share == pytest.approx(1.0, abs=0.05)
    assert profiles["asr"].per_unit_s == pytest.approx(0.05, rel=0.05)
    assert profiles["chat"].tbt_s == pytest.approx(0.03, rel=0.05)
    assert profiles["chat"].prefill_tps == pytest.approx(3000, rel=0.1)
    assert profiles["chat"].true_weights == 2 * 2**30


def test_an_exported_history_is_a_scenario_that_simulate_reads(
    recorded: Path, tmp_path: Path
) -> None:
    exported = export_history(read_history(recorded))
    path = exported.write(tmp_path / "out")
    scn = load_scenario(path)
    rows = read_trace(tmp_path / "out" / "requests.csv")
    assert len(rows) == len(exported.trace) > 200
    assert scn.config.simulation.services["chat"].true_weights == 2 * 2**30
    assert scn.start_s_of_day == pytest.approx(18 * 3600)
    assert read_timeline(tmp_path / "out" / "timeline.csv")
    text = (tmp_path / "out" / "requests.csv").read_text()
    assert text.startswith("# accelmux request trace, format 1\n")


def test_the_replay_of_a_history_the_simulator_recorded_gives_it_back(
    recorded: Path, tmp_path: Path
) -> None:
    history = read_history(recorded)
    path = export_history(history).write(tmp_path / "out")
    scn = load_scenario(path)
    rows = read_trace(tmp_path / "out" / "requests.csv")
    services = scn.config.services
    real = [
        from_trace(r, services[r.service].cls.label, services[r.service].kind.is_llm) for r in rows
    ]
    rep = replay(scn, "accelmux")
    result = compare(
        real,
        rep.outcomes(),
        slo_table(services),
        since=0.0,
        real_samples=history.samples,
        sim_samples=rep.samples,
        real_decisions=history.decisions,
        sim_decisions=rep.decisions,
    )
    assert result["requests"] == len(rows)
    assert result["agreement"] >= 0.98
    for cls, side in result["classes"].items():
        err = side["error"]
        assert abs(err["p50_rel"]) < 0.05, (cls, err)
        assert abs(err["attainment_pts"]) <= 2.0, (cls, err)
    for dev in result["memory"].values():
        assert abs(dev["peak_rel"]) < 0.02
    assert (
        result["decisions"]["real"]["total"]["loads"]
        == result["decisions"]["sim"]["total"]["loads"]
    )


def test_a_trace_of_another_format_or_cut_short_is_refused(tmp_path: Path, recorded: Path) -> None:
    exported = export_history(read_history(recorded))
    path = tmp_path / "t.csv"
    write_trace(path, exported.trace[:5])
    lines = path.read_text().splitlines()
    (tmp_path / "old.csv").write_text("\n".join(["# accelmux request trace, format 0", *lines[1:]]))
    with pytest.raises(RecordedError, match=r"format 0, this accelmux reads .*format 1"):
        read_trace(tmp_path / "old.csv")
    (tmp_path / "cut.csv").write_text("\n".join(lines)[:-20])
    with pytest.raises(RecordedError, match=r"line 7: .* values for .* columns"):
        read_trace(tmp_path / "cut.csv")
    (tmp_path / "none.csv").write_text("index,arrival_s\n1,2\n")
    with pytest.raises(RecordedError, match=r"not an accelmux request trace"):
        read_trace(tmp_path / "none.csv")


def test_the_run_keeps_no_secret_and_no_backend(tmp_path: Path) -> None:
    from accelmux.config.load import load_config_data
    from accelmux.config.specs import to_manager_spec
    from accelmux.history.daemon_run import new_run

    data = copy.deepcopy(home())
    data.pop("workloads"), data.pop("simulation")
    data["server"] = {"api_keys": ["sk-secret"], "admin_key": "adm-secret"}
    for svc in data["services"].values():
        svc["backend"] = {"type": "fake"}
    data["services"]["chat"]["backend"] = {
        "type": "external",
        "argv": ["llama-server", "--api-key", "very-secret"],
        "env": {"TOKEN": "env-secret"},
    }
    cfg = load_config_data(data, "t")
    run = new_run(cfg, to_manager_spec(cfg), "t")
    blob = run.config + run.spec
    for secret in ("sk-secret", "adm-secret", "very-secret", "env-secret", "llama-server"):
        assert secret not in blob
    assert json.loads(run.config)["services"]["chat"]["class"] == "interactive"


def test_a_services_threads_are_read_from_the_counts_taken_while_it_ran_alone() -> None:
    from accelmux.plan.calibrate import IDLE, LOAD, _Run, solo_threads

    def sample(t: float, ticks: list[tuple[float, int]]) -> SampleRecord:
        text = ";".join(f"{round(x * 1000)}:{m}:{m + 3}" for x, m in ticks)
        return SampleRecord("s", t, "host", 0, 0, 0, 0, "{}", ticks=text)

    runs = [_Run("chat", 1.0, 2.0), _Run("embed", 3.0, 4.0), _Run("chat", 3.5, 4.5)]
    samples = [
        sample(1.0, [(0.2, 0), (0.6, 1)]),  # idle
        sample(2.0, [(1.2, 2), (1.4, 2), (1.8, 2)]),  # chat alone: 2 counted, idle 0.5
        sample(4.0, [(3.2, 3), (3.6, 9), (3.8, 9)]),  # embed alone, then both: not read
        sample(6.0, [(5.2, 4), (5.4, 4)]),  # a load alone
    ]
    threads, counts = solo_threads(samples, runs, [(5.0, 5.5)])
    assert counts == {IDLE: 2, "chat": 3, "embed": 1, LOAD: 2}
    assert threads["chat"] == pytest.approx(1.5) and threads[LOAD] == pytest.approx(3.5)
    assert threads[IDLE] == pytest.approx(0.5)


def test_contention_weights_read_from_service_times_are_the_simulators_own(
    tmp_path: Path,
) -> None:
    """A home busy enough that requests run beside each other: the weights the fit reads
    from the service times are the shares the simulator ran with (its model: a running
    request slows the others by its share), and the speeds are its speeds."""
    data = home()
    for w in data["workloads"]:
        w["rate_per_h"] *= 4
    profiles = calibrate(read_history(record(data, tmp_path)))
    for name, share in (("asr", 0.5), ("chat", 0.5), ("embed", 1.0)):
        assert profiles[name].weight == pytest.approx(share, abs=0.05), name
    assert profiles["embed"].per_unit_s == pytest.approx(0.02, rel=0.02)
