"""A newcomer's first commands, timed on a fresh clone with nothing cached.

    .venv/bin/python bench/bench_setup.py                 # first scripts/run (the default)
    .venv/bin/python bench/bench_setup.py --measure test  # first and second scripts/test

Each measurement clones the committed tree (``git clone`` of this checkout) into a new
temporary directory and points ``ACCELMUX_WHEEL_CACHE`` and ``PIP_CACHE_DIR`` at empty
directories, so nothing built or downloaded before is reused:

* ``first_run``: ``scripts/run --port P`` until ``GET /v1/models`` answers 200 (the README's
  first command: install accelmux and its models, build llama.cpp, serve the default stack);
* ``first_test`` and ``second_test``: ``scripts/test`` twice in the same clone (the second
  finds the wheel, the build tree and llama-server in its cache).

The results are merged into ``bench/results/setup.json`` (a measurement not taken keeps its
earlier figures, or is absent: the README says which were measured); each carries its own
commit, date and the load average before and after, since a shared machine's load changes
what a build takes. ``bench/render_setup.py`` renders them into the README.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from meta import ROOT, run_meta

RESULTS = ROOT / "bench" / "results" / "setup.json"
#: The README's targets, in seconds (on 2 cores).
TARGETS = {"first_run": 600, "first_test": 1800, "second_test": 720}
STEP = re.compile(r"^== (?P<step>[^=].*?)\s*$")
SUMMARY = re.compile(r"=+ (?P<summary>.*\b(passed|failed|error)\b.*?) =+$")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _fresh_clone(work: Path) -> Path:
    clone = work / "accelmux"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    return clone


def _meta(clone: Path, settings: dict[str, Any]) -> dict[str, Any]:
    """``run_meta`` taken as the measurement starts, naming the commit the clone holds
    (what was measured: a clone has no uncommitted change)."""
    meta = run_meta(settings)
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True, check=True
    )
    meta["commit"], meta["dirty"] = head.stdout.strip(), False
    return meta


def _env(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELMUX_", "PYTHON"))}
    env.pop("VIRTUAL_ENV", None)
    for name in ("wheel-cache", "pip-cache", "model-cache"):
        (work / name).mkdir()
    env["ACCELMUX_WHEEL_CACHE"] = str(work / "wheel-cache")
    env["PIP_CACHE_DIR"] = str(work / "pip-cache")
    env["ACCELMUX_MODEL_CACHE"] = str(work / "model-cache")  # the joined Gemma GGUF
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if "/.venv/" not in p
    )
    return env


def _steps(log: list[tuple[float, str]]) -> list[dict[str, Any]]:
    """The ``== ...`` progress lines of the scripts, with the second each appeared at."""
    out = []
    for at, line in log:
        m = STEP.match(line)
        if m:
            out.append({"at_s": round(at, 1), "step": m.group("step")[:160]})
    return out


def _models_answer(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def measure_first_run(timeout_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="accelmux-first-run-") as tmp:
        work = Path(tmp)
        clone = _fresh_clone(work)
        meta = _meta(clone, {"measure": "run", "timeout_s": timeout_s})
        port = _free_port()
        load_before = _load()
        started = time.monotonic()
        log_path = work / "run.log"
        with log_path.open("w") as log_file:
            proc = subprocess.Popen(
                ["scripts/run", "--port", str(port)],
                cwd=clone,
                env=_env(work),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            stamped: list[tuple[float, str]] = []
            seen = 0
            answered = None
            try:
                while time.monotonic() - started < timeout_s and proc.poll() is None:
                    lines = log_path.read_text(errors="replace").splitlines()
                    stamped += [(time.monotonic() - started, line) for line in lines[seen:]]
                    seen = len(lines)
                    if _models_answer(port):
                        answered = time.monotonic() - started
                        break
                    time.sleep(1.0)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
                    try:
                        proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
        lines = log_path.read_text(errors="replace").splitlines()
        stamped += [(time.monotonic() - started, line) for line in lines[seen:]]
        result: dict[str, Any] = {
            "measured": True,
            "command": "scripts/run --port P, until GET /v1/models answers 200",
            "seconds": None if answered is None else round(answered, 1),
            "ok": answered is not None,
            "target_s": TARGETS["first_run"],
            "load_avg_before": load_before,
            "load_avg_after": _load(),
            "steps": _steps(stamped),
            "meta": meta,
        }
        if answered is None:
            result["log_tail"] = lines[-30:]
        return result


def _timed_test(clone: Path, env: dict[str, str], timeout_s: float) -> dict[str, Any]:
    meta = _meta(clone, {"measure": "test", "timeout_s": timeout_s})
    load_before = _load()
    started = time.monotonic()
    stamped: list[tuple[float, str]] = []
    proc = subprocess.Popen(
        ["scripts/test"],
        cwd=clone,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            stamped.append((time.monotonic() - started, line.rstrip("\n")))
            if time.monotonic() - started > timeout_s:
                os.killpg(proc.pid, signal.SIGKILL)
                break
    finally:
        rc = proc.wait()
    took = time.monotonic() - started
    summary = next(
        (m.group("summary") for _, line in reversed(stamped) if (m := SUMMARY.search(line))),
        None,
    )
    return {
        "measured": True,
        "command": "scripts/test",
        "seconds": round(took, 1),
        "ok": rc == 0,
        "exit_code": rc,
        "pytest": summary,
        "load_avg_before": load_before,
        "load_avg_after": _load(),
        "steps": _steps(stamped),
        "meta": meta,
    }


def measure_tests(timeout_s: float) -> dict[str, dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="accelmux-first-test-") as tmp:
        work = Path(tmp)
        clone = _fresh_clone(work)
        env = _env(work)
        first = _timed_test(clone, env, timeout_s) | {"target_s": TARGETS["first_test"]}
        second = _timed_test(clone, env, timeout_s) | {"target_s": TARGETS["second_test"]}
        shutil.rmtree(clone / ".venv", ignore_errors=True)
        return {"first_test": first, "second_test": second}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--measure", choices=("run", "test", "all"), default="run")
    parser.add_argument("--timeout-s", type=float, default=3600.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.is_file() else {}
    measurements: dict[str, Any] = results.get("measurements", {})
    taken: dict[str, Any] = {}
    if args.measure in ("run", "all"):
        taken["first_run"] = measure_first_run(args.timeout_s)
    if args.measure in ("test", "all"):
        taken.update(measure_tests(args.timeout_s))
    measurements.update(taken)
    # the top-level meta is the latest measurement's (each measurement keeps its own)
    latest = max(measurements.values(), key=lambda m: str(m["meta"]["date"]))
    results = {"meta": latest["meta"], "targets_s": TARGETS, "measurements": measurements}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    for name, m in taken.items():
        print(
            f"{name}: {m['seconds']} s (ok={m['ok']}, load {m['load_avg_before']} -> "
            f"{m['load_avg_after']})"
        )


if __name__ == "__main__":
    main()
