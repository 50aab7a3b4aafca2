"""``accelmux simulate``: exit codes, clear errors, the table and the JSON shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.sim.support import tiny, write_scenario, write_trace

from accelmux.cli import main
from accelmux.sim.runner import simulate


def _tiny_file(tmp_path: Path, **sim: object) -> Path:
    data = tiny()
    data["simulation"].update({"duration_s": 200, **sim})
    return write_scenario(tmp_path / "tiny.yaml", data)


def test_missing_scenario_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(tmp_path / "nope.yaml")]) == 2
    assert "scenario not found" in capsys.readouterr().err


def test_invalid_scenario_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("devices: {}\nworkloads: []\n", encoding="utf-8")
    assert main(["simulate", str(path)]) == 2
    assert "problem(s)" in capsys.readouterr().err


def test_missing_trace_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tiny()
    data["workloads"] = [{"type": "trace", "service": "chat", "rate_per_h": 60, "path": "x.csv"}]
    path = write_scenario(tmp_path / "t.yaml", data)
    assert main(["simulate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "trace file not found" in err and "--trace" in err
    assert main(["simulate", str(path), "--trace", str(tmp_path / "missing.csv")]) == 2
    assert "trace not found" in capsys.readouterr().err


def test_unknown_policy_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(_tiny_file(tmp_path)), "--policies", "nope"]) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("variant", "message"),
    [
        ("ollama+containers[max_loaded_models=0]", "max_loaded_models"),
        ("ollama+containers[bogus=1]", "bogus"),
        ("static[x=1]", "has no settings to vary"),
        ("llama-swap[layout=custom]", "layout custom needs groups"),
        ("ollama+containers[num_parallel=4", "expected NAME[key=value"),
    ],
)
def test_bad_variant_exits_2_naming_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], variant: str, message: str
) -> None:
    assert main(["simulate", str(_tiny_file(tmp_path)), "--policies", variant]) == 2
    assert message in capsys.readouterr().err


def test_variants_run_under_their_own_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.json"
    variants = "ollama+containers[max_loaded_models=7,num_parallel=4],llama-swap[layout=no-groups]"
    args = ["simulate", str(_tiny_file(tmp_path)), "--policies", variants, "--seeds", "1"]
    assert main([*args, "--device-gib", "8", "--workers", "1", "--json", str(out)]) == 0
    results = json.loads(out.read_text(encoding="utf-8"))["results"]
    assert set(results) == {
        "ollama+containers[max_loaded_models=7,num_parallel=4]",
        "llama-swap[layout=no-groups]",
    }


def test_table_and_json_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "trace.csv", [0.2] * 200)
    data = tiny()
    data["simulation"]["duration_s"] = 200
    data["workloads"].append({"type": "trace", "service": "chat", "rate_per_h": 120})
    path = write_scenario(tmp_path / "tiny.yaml", data)
    out = tmp_path / "out" / "r.json"
    code = main(
        [
            "simulate",
            str(path),
            "--seeds",
            "2",
            "--device-gib",
            "6,8",
            "--json",
            str(out),
            "--trace",
            str(trace),
            "--workers",
            "1",
        ]
    )
    assert code == 0
    table = capsys.readouterr().out
    for name in ("accelmux", "independent", "static", "ollama+containers", "llama-swap", "oracle"):
        assert name in table
    report = json.loads(out.read_text(encoding="utf-8"))
    results = report["results"]
    assert set(results) == {
        "accelmux",
        "independent",
        "static",
        "ollama+containers",
        "llama-swap",
        "oracle",
    }
    for row in results.values():
        assert isinstance(row["oom_events"], int | float)
        assert "batch_done_in_window" in row
        for cls in row["classes"].values():
            assert {"slo_attainment", "p99_s"} <= set(cls)
        assert set(row["device_sweep"]) == {"6", "8"}
        assert "smallest_device_gib" in row
    assert report["seeds"] == 2


def test_simulate_means_over_seeds(tmp_path: Path) -> None:
    path = _tiny_file(tmp_path)
    report = simulate(str(path), policies=["accelmux"], seeds=2, sweep_gib=[], workers=1)
    row = report["results"]["accelmux"]
    per_seed = [s["slo_attainment"]["realtime"] for s in row["per_seed"]]
    assert row["classes"]["realtime"]["slo_attainment"] == pytest.approx(sum(per_seed) / 2)
    assert row["spread"]["classes"]["realtime"]["min"] == min(per_seed)


def test_counters_average_with_zero_for_runs_without_them() -> None:
    from accelmux.sim.runner import _mean_counts

    assert _mean_counts([{"a": 2}, {}, {"a": 1, "b": 3}]) == {"a": 1.0, "b": 1.0}
