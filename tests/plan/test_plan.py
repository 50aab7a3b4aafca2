"""accelmux plan: the changes a user asks, the table, and every input it must refuse."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tests.plan.support import home, record, write_gguf

from accelmux.cli import main
from accelmux.history.store import history_files, read_history
from accelmux.plan.changes import Change, ChangeError, NewService
from accelmux.plan.engine import PlanError, plan_from_history
from accelmux.plan.export import export_history
from accelmux.plan.report import text


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record(home(), tmp_path_factory.mktemp("home"))


@pytest.fixture(scope="module")
def scenario_data(recorded: Path) -> dict:
    return export_history(read_history(recorded)).scenario


def test_a_smaller_budget_is_planned_and_the_first_service_to_suffer_named(recorded: Path) -> None:
    plan = plan_from_history(
        read_history(recorded), [Change(budget_gib=2.5), Change(device_gib=12)]
    )
    _recorded_col, replay_col, small, big = plan.columns
    assert [c.kind for c in plan.columns] == ["recorded", "replay", "change", "change"]
    assert replay_col.first_to_suffer is not None and replay_col.first_to_suffer["service"] is None
    # 2.5 GiB: asr (pinned) and chat no longer fit together: chat misses, first
    assert small.first_to_suffer is not None and small.first_to_suffer["service"] == "chat"
    assert small.first_to_suffer["newly_missed"]["chat"] > 10
    assert small.memory["gpu"]["peak"] < replay_col.memory["gpu"]["peak"]
    assert big.first_to_suffer["service"] is None
    assert big.classes["realtime"]["attainment"] == replay_col.classes["realtime"]["attainment"]
    table = text(plan)
    for label in (
        "recorded",
        "replay",
        "budget 2.5 GiB",
        "12 GiB device",
        "first to suffer",
        "chat at",
    ):
        assert label in table
    data = json.loads(json.dumps(plan.as_dict()))
    assert data["columns"][2]["timeline"]["gpu"], "the memory-over-time series"


def test_a_device_no_service_fits_is_refused(recorded: Path) -> None:
    with pytest.raises(PlanError, match=r"no service fits on the device.*the smallest, asr, needs"):
        plan_from_history(read_history(recorded), [Change(device_gib=0.25)])


def test_a_history_too_short_says_so(tmp_path: Path) -> None:
    directory = record(home(duration_s=200), tmp_path)
    with pytest.raises(PlanError, match=r"too short to say anything: .* requests over 3.*min"):
        plan_from_history(read_history(directory), [])


def test_the_shortest_history_is_a_parameter(recorded: Path) -> None:
    history = read_history(recorded)
    with pytest.raises(PlanError, match=r"at least 50 requests over 10000 min"):
        plan_from_history(history, [], min_span_s=600_000.0)
    assert plan_from_history(history, [], min_span_s=60.0).columns


def test_a_service_added_from_the_catalogue_gets_a_scaled_speed(
    scenario_data: dict, tmp_path: Path
) -> None:
    change = Change(
        add_services=(NewService.parse("name=coder,catalogue=qwen2.5-7b,rate_per_h=30"),)
    )
    data, notes = change.apply(scenario_data, tmp_path)
    assert data["services"]["coder"]["memory"]["weights"] == 4680 * 10**6
    perf = data["simulation"]["services"]["coder"]
    assert perf["tbt_s"] == pytest.approx(
        scenario_data["simulation"]["services"]["chat"]["tbt_s"] * 4680e6 / 2**31, rel=1e-6
    )
    assert data["workloads"][-1]["service"] == "coder"
    assert "scaled from chat" in notes[0]


def test_a_service_added_from_a_gguf_reads_its_header(
    recorded: Path, scenario_data: dict, tmp_path: Path
) -> None:
    path = write_gguf(tmp_path / "coder.gguf", layers=4, kv_heads=2, embd=256, heads=4)
    data, notes = Change(add_services=(NewService.parse(f"name=coder,gguf={path}"),)).apply(
        scenario_data, tmp_path
    )
    memory = data["services"]["coder"]["memory"]
    assert memory["weights"] == 4 << 20
    assert memory["kv_per_token"] == 4 * 2 * (64 + 64) * 2  # layers x kv heads x (K+V dims) x f16
    assert "scaled from chat" in notes[0]
    with pytest.raises(PlanError, match=r"missing.gguf"):
        plan_from_history(
            read_history(recorded),
            [Change(add_services=(NewService.parse(f"name=c,gguf={tmp_path}/missing.gguf"),))],
        )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("gguf=/x.gguf", "needs name=NAME"),
        ("name=x", "exactly one of gguf=FILE and catalogue=NAME"),
        ("name=x,catalogue=nope", "no catalogue entry 'nope'"),
        ("name=x,catalogue=qwen2.5-7b,rate_per_h=lots", "rate_per_h must be a number"),
        ("name=x,catalogue=qwen2.5-7b,colour=red", "unknown key 'colour'"),
        ("name=asr,catalogue=qwen2.5-7b", "a service of that name exists"),
    ],
)
def test_a_bad_new_service_is_named(
    scenario_data: dict, tmp_path: Path, spec: str, message: str
) -> None:
    with pytest.raises(ChangeError, match=message):
        Change(add_services=(NewService.parse(spec),)).apply(scenario_data, tmp_path)


def test_a_set_edits_the_field_as_the_config_spells_it(scenario_data: dict, tmp_path: Path) -> None:
    change = Change(sets=(("embed.windows", "02:00-04:00,13:00-14:00"), ("chat.queue.limit", "4")))
    data, _ = change.apply(scenario_data, tmp_path)
    assert data["services"]["embed"]["windows"] == ["02:00-04:00", "13:00-14:00"]
    assert data["services"]["chat"]["queue"]["limit"] == 4
    assert scenario_data["services"]["chat"]["queue"]["limit"] != 4  # the original stays


def test_other_bad_changes_are_named(scenario_data: dict, tmp_path: Path) -> None:
    with pytest.raises(ChangeError, match=r"cannot remove 'nope'"):
        Change(remove_services=("nope",)).apply(scenario_data, tmp_path)
    with pytest.raises(ChangeError, match=r"expected SERVICE.FIELD=VALUE"):
        Change(sets=(("nope.class", "batch"),)).apply(scenario_data, tmp_path)
    with pytest.raises(ChangeError, match=r"more than the device holds"):
        Change(budget_gib=100).apply(scenario_data, tmp_path)
    with pytest.raises(ChangeError, match=r"must be positive"):
        Change(device_gib=-1).apply(scenario_data, tmp_path)


def test_a_window_a_removal_and_a_policy_are_replayed(recorded: Path) -> None:
    history = read_history(recorded)
    plan = plan_from_history(
        history,
        [
            Change(sets=(("embed.windows", "02:00-04:00"),)),
            Change(remove_services=("chat",)),
            Change(policy="llama-swap"),
        ],
    )
    window, removed, swap = plan.columns[2:]
    # outside its window, batch runs only on spare memory: here there is, so it still runs
    assert window.classes["batch"]["requests"] == plan.columns[1].classes["batch"]["requests"]
    assert "chat" not in removed.services
    assert swap.policy == "llama-swap"
    bad = [Change(sets=(("embed.class", "urgent"),))]
    with pytest.raises(PlanError, match=r"not valid: services.embed.class"):
        plan_from_history(history, bad)


# ---- the command line ---------------------------------------------------------------------
def test_plan_and_export_from_the_command_line(
    recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = recorded.parent
    assert main(["plan", "--data-dir", str(data_dir), "--budget-gib", "2.5,4"]) == 0
    out = capsys.readouterr().out
    assert "budget 2.5 GiB" in out and "budget 4 GiB" in out
    assert main(["plan", "--data-dir", str(data_dir), "--device-gib", "8", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [c["label"] for c in data["columns"]] == ["recorded", "replay", "8 GiB device"]
    assert (
        main(["history", "export", "--data-dir", str(data_dir), "--out", str(tmp_path / "e")]) == 0
    )
    assert "accelmux simulate" in capsys.readouterr().out
    assert main(["simulate", str(tmp_path / "e" / "scenario.yaml"), "--policies", "accelmux"]) == 0
    assert main(["history", "show", "--data-dir", str(data_dir)]) == 0
    assert "measured profiles" in capsys.readouterr().out


def test_bad_input_on_the_command_line_is_one_clear_line(
    recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--data-dir", str(tmp_path / "none")]) == 1
    assert "no history in" in capsys.readouterr().err
    broken = tmp_path / "broken"
    shutil.copytree(recorded.parent, broken)
    for path in history_files(broken / "history"):
        path.write_bytes(path.read_bytes()[:200])
        for suffix in ("-wal", "-shm"):
            (path.parent / (path.name + suffix)).unlink(missing_ok=True)
    assert main(["plan", "--data-dir", str(broken)]) == 1
    err = capsys.readouterr().err
    assert "no readable history" in err and "damaged" in err and "Traceback" not in err
    assert main(["plan", "--data-dir", str(recorded.parent), "--device-gib", "0.2"]) == 1
    assert "no service fits" in capsys.readouterr().err
    assert main(["plan", "--data-dir", str(recorded.parent), "--last", "soon"]) == 1
    assert "not a duration" in capsys.readouterr().err
    assert main(["plan", "--data-dir", str(recorded.parent), "--add-service", "name=x"]) == 1
    assert "exactly one of" in capsys.readouterr().err


def test_a_second_device_and_a_faster_one(recorded: Path) -> None:
    plan = plan_from_history(
        read_history(recorded), [Change(add_device_gib=4), Change(compute_scale=2.0)]
    )
    second, faster = plan.columns[2:]
    assert set(second.memory) == {"gpu", "gpu2"}
    replay_p50 = plan.columns[1].classes["realtime"]["p50_s"]
    assert faster.classes["realtime"]["p50_s"] == pytest.approx(replay_p50 / 2, rel=0.1)
