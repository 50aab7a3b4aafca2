"""A newcomer's first commands, timed on a fresh clone with nothing cached.

    .venv/bin/python bench/bench_setup.py                  # first scripts/run (the default)
    .venv/bin/python bench/bench_setup.py --measure fast   # scripts/test --fast, twice
    .venv/bin/python bench/bench_setup.py --measure test   # first and second scripts/test
    .venv/bin/python bench/bench_setup.py --measure wheel  # the wheel, setup, serve
    .venv/bin/python bench/bench_setup.py --measure fast test wheel  # several, in one run

Each measurement clones the committed tree (``git clone`` of this checkout) into a new
temporary directory and gives it a home of its own: ``HOME``, the ``XDG_*`` directories,
``PIP_CACHE_DIR``, ``ACCELMUX_WHEEL_CACHE`` (the llama.cpp build tree and wheel) and
``ACCELMUX_MODEL_CACHE`` all point at empty directories, so nothing built, downloaded or
cached before is reused (the machine's own package index settings stay):

* ``first_run``: ``scripts/run --port P`` until ``GET /v1/models`` answers 200 (the README's
  first command: install accelmux and its models, build llama.cpp, serve the default stack);
* ``fast_cold`` and ``fast``: ``scripts/test --fast`` in a fresh clone with empty caches,
  then in a second fresh clone that reuses only the first one's pip cache (the target:
  the edit-test loop of someone who has installed Python packages before);
* ``first_test`` and ``second_test``: ``scripts/test`` twice in the same clone (the second
  finds the virtualenvs, the wheel, the build tree and llama-server in place);
* ``wheel``: what a user of the package does, outside any checkout: build the wheel
  (``pip wheel``), install it into a new virtualenv, ``accelmux setup`` (which builds
  llama.cpp: its cache is empty), ``accelmux serve`` until ``GET /v1/models`` answers.

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
TARGETS: dict[str, float | None] = {
    "first_run": 600,
    "fast_cold": None,
    "fast": 90,
    "first_test": 600,
    "second_test": 360,
    "wheel": None,
}
STEP = re.compile(r"^== (?P<step>[^=].*?)\s*$")
SUMMARY = re.compile(r"^=*\s*(?P<summary>\d+ (passed|failed|errors?)\b.*? in [\d.]+s\b.*?)\s*=*$")


def _deadline(timeout_s: float, end: float) -> float:
    """When a command started now is stopped: after ``timeout_s``, or at ``end`` (the whole
    run's end, monotonic: ``--total-s``)."""
    return min(time.monotonic() + timeout_s, end)


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


#: Each measurement's own home: every cache a run could reuse points in here.
HOME_DIRS = {
    "HOME": "home",
    "XDG_CACHE_HOME": "home/.cache",
    "XDG_CONFIG_HOME": "home/.config",
    "XDG_DATA_HOME": "home/.local/share",
    "XDG_STATE_HOME": "home/.local/state",
    "PIP_CACHE_DIR": "pip-cache",
    "ACCELMUX_WHEEL_CACHE": "wheel-cache",
    "ACCELMUX_MODEL_CACHE": "model-cache",  # the joined Gemma GGUF
}


def _env(work: Path, pip_cache: Path | None = None) -> dict[str, str]:
    """The environment of a measurement in ``work``: empty caches (``pip_cache``: reuse
    that pip cache instead), no virtualenv or checkout on the paths."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELMUX_", "PYTHON"))}
    for name in ("VIRTUAL_ENV", "XDG_RUNTIME_DIR"):
        env.pop(name, None)
    for name, sub in HOME_DIRS.items():
        (work / sub).mkdir(parents=True, exist_ok=True)
        env[name] = str(work / sub)
    if pip_cache is not None:
        env["PIP_CACHE_DIR"] = str(pip_cache)
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


class Timed:
    """One command run with its output timestamped line by line (each ``== step`` line
    marks when a step began) and the load average before and after."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.stamped: list[tuple[float, str]] = []
        self.load_before = _load()

    def at(self) -> float:
        return time.monotonic() - self.started

    def note(self, line: str) -> None:
        self.stamped.append((self.at(), line))

    def run(self, argv: list[str], cwd: Path, env: dict[str, str], deadline: float) -> int:
        """Run ``argv`` to its end (killed at ``deadline``, monotonic); its exit status."""
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                self.note(line.rstrip("\n"))
                if time.monotonic() > deadline:
                    os.killpg(proc.pid, signal.SIGKILL)
                    break
        finally:
            rc = proc.wait()
        return rc

    def serve_until_models(
        self, argv: list[str], cwd: Path, env: dict[str, str], port: int, deadline: float
    ) -> float | None:
        """Start ``argv`` (a daemon) and poll ``/v1/models``; the second it answered
        (None: it exited or the deadline passed). The daemon is stopped after."""
        log_path = cwd / f"serve-{port}.log"
        with log_path.open("w") as log_file:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            seen, answered = 0, None
            try:
                while time.monotonic() < deadline and proc.poll() is None:
                    lines = log_path.read_text(errors="replace").splitlines()
                    for line in lines[seen:]:
                        self.note(line)
                    seen = len(lines)
                    if _models_answer(port):
                        answered = self.at()
                        break
                    time.sleep(1.0)
            finally:
                _stop(proc)
            for line in log_path.read_text(errors="replace").splitlines()[seen:]:
                self.note(line)
        return answered

    def result(
        self, name: str, command: str, seconds: float | None, ok: bool, meta: dict[str, Any]
    ) -> dict[str, Any]:
        summary = [m.group("summary") for _, line in self.stamped if (m := SUMMARY.search(line))]
        out: dict[str, Any] = {
            "measured": True,
            "command": command,
            "seconds": None if seconds is None else round(seconds, 1),
            "ok": ok,
            "target_s": TARGETS[name],
            "load_avg_before": self.load_before,
            "load_avg_after": _load(),
            "steps": _steps(self.stamped),
            "meta": meta,
        }
        if summary:
            out["pytest"] = summary
        if not ok:
            out["log_tail"] = [line for _, line in self.stamped[-40:]]
        return out


def _stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def measure_first_run(timeout_s: float, end: float) -> dict[str, dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="accelmux-first-run-") as tmp:
        work = Path(tmp)
        clone = _fresh_clone(work)
        meta = _meta(clone, {"measure": "run", "timeout_s": timeout_s})
        port = _free_port()
        timed = Timed()
        argv = ["scripts/run", "--port", str(port)]
        deadline = _deadline(timeout_s, end)
        answered = timed.serve_until_models(argv, clone, _env(work), port, deadline)
        command = "scripts/run --port P, until GET /v1/models answers 200"
        return {"first_run": timed.result("first_run", command, answered, bool(answered), meta)}


def _timed_script(
    name: str, clone: Path, env: dict[str, str], argv: list[str], timeout_s: float, end: float
) -> dict[str, Any]:
    meta = _meta(clone, {"measure": name, "timeout_s": timeout_s})
    if _deadline(timeout_s, end) <= time.monotonic():
        # Not started: the run's --total-s is spent (an earlier figure is replaced, as it
        # was measured on another commit).
        reason = "not started: the run's --total-s was spent"
        return {"measured": False, "reason": reason, "meta": meta}
    timed = Timed()
    rc = timed.run(argv, clone, env, _deadline(timeout_s, end))
    out = timed.result(name, " ".join(argv), timed.at(), rc == 0, meta)
    out["exit_code"] = rc
    return out


def measure_fast(timeout_s: float, end: float) -> dict[str, dict[str, Any]]:
    """``scripts/test --fast`` on a fresh clone with empty caches, then on a second fresh
    clone with only the first one's pip cache kept."""
    with tempfile.TemporaryDirectory(prefix="accelmux-fast-") as tmp:
        cold_work, warm_work = Path(tmp) / "cold", Path(tmp) / "warm"
        cold_work.mkdir()
        warm_work.mkdir()
        argv = ["scripts/test", "--fast"]
        clone = _fresh_clone(cold_work)
        cold = _timed_script("fast_cold", clone, _env(cold_work), argv, timeout_s, end)
        clone = _fresh_clone(warm_work)
        env = _env(warm_work, pip_cache=cold_work / HOME_DIRS["PIP_CACHE_DIR"])
        warm = _timed_script("fast", clone, env, argv, timeout_s, end)
        return {"fast_cold": cold, "fast": warm}


def measure_tests(timeout_s: float, end: float) -> dict[str, dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="accelmux-first-test-") as tmp:
        work = Path(tmp)
        clone = _fresh_clone(work)
        env = _env(work)
        first = _timed_script("first_test", clone, env, ["scripts/test"], timeout_s, end)
        second = _timed_script("second_test", clone, env, ["scripts/test"], timeout_s, end)
        shutil.rmtree(clone / ".venv", ignore_errors=True)
        return {"first_test": first, "second_test": second}


WHEEL_COMMAND = (
    "pip wheel --no-deps .; python3 -m venv V; V/bin/pip install accelmux-*.whl; "
    "V/bin/accelmux setup; V/bin/accelmux serve --port P, until GET /v1/models answers 200"
)


def measure_wheel(timeout_s: float, end: float) -> dict[str, dict[str, Any]]:
    """The package alone, outside the checkout, every cache empty."""
    with tempfile.TemporaryDirectory(prefix="accelmux-wheel-") as tmp:
        work = Path(tmp)
        clone = _fresh_clone(work)
        meta = _meta(clone, {"measure": "wheel", "timeout_s": timeout_s})
        env = _env(work)
        user = work / "user"  # where the user works: not the checkout
        user.mkdir()
        timed = Timed()
        deadline = _deadline(timeout_s, end)
        venv = user / "venv"
        steps = [
            ("building the wheel", ["python3", "-m", "pip", "wheel", "-q", "--no-deps",
                                    "-w", str(work / "dist"), str(clone)]),
            ("a new virtualenv", ["python3", "-m", "venv", str(venv)]),
        ]  # fmt: skip
        ok = True
        for label, argv in steps:
            timed.note(f"== {label}")
            ok = ok and timed.run(argv, user, env, deadline) == 0
        wheels = sorted((work / "dist").glob("accelmux-*.whl"))
        answered = None
        if ok and wheels:
            pip, accelmux = str(venv / "bin" / "pip"), str(venv / "bin" / "accelmux")
            for label, argv in (
                ("installing the wheel", [pip, "install", "-q", str(wheels[0])]),
                ("accelmux setup", [accelmux, "setup"]),
            ):
                timed.note(f"== {label}")
                ok = ok and timed.run(argv, user, env, deadline) == 0
            if ok:
                timed.note("== accelmux serve")
                port = _free_port()
                argv = [accelmux, "serve", "--port", str(port)]
                answered = timed.serve_until_models(argv, user, env, port, deadline)
        done = ok and answered is not None
        return {"wheel": timed.result("wheel", WHEEL_COMMAND, answered, done, meta)}


MEASURES = {
    "run": measure_first_run,
    "fast": measure_fast,
    "test": measure_tests,
    "wheel": measure_wheel,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--measure",
        choices=(*MEASURES, "all"),
        nargs="+",
        default=["run"],
        help="one or more, taken in the order given (all: run, fast, test, wheel)",
    )
    parser.add_argument("--timeout-s", type=float, default=3600.0, help="for each command")
    parser.add_argument("--total-s", type=float, help="for the whole run (default: none)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.is_file() else {}
    measurements: dict[str, Any] = results.get("measurements", {})
    end = time.monotonic() + (args.total_s if args.total_s is not None else float("inf"))
    taken: dict[str, Any] = {}
    for name in MEASURES if "all" in args.measure else dict.fromkeys(args.measure):
        taken.update(MEASURES[name](args.timeout_s, end))
        # merged and written after each, so a later failure keeps what was measured
        measurements.update(taken)
        latest = max(measurements.values(), key=lambda m: str(m["meta"]["date"]))
        results = {"meta": latest["meta"], "targets_s": TARGETS, "measurements": measurements}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    for name, m in taken.items():
        if not m["measured"]:
            print(f"{name}: {m['reason']}")
            continue
        print(
            f"{name}: {m['seconds']} s (ok={m['ok']}, load {m['load_avg_before']} -> "
            f"{m['load_avg_after']})"
        )


if __name__ == "__main__":
    main()
