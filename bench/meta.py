"""What every benchmark result records about its run: commit, date, machine, settings.

Each ``bench/*.py`` puts ``run_meta(settings)`` under the key ``"meta"`` of the JSON it
writes, so a figure in the docs can always be traced to the code, the policy's decisions
(``decisions``: bench/policy_digest.py) and the machine that made it.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str:
    try:
        out = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def decision_digest() -> dict[str, str]:
    """The decision digest of the policy this checkout runs (bench/policy_digest.py): a
    figure that comes from the Manager's decisions is true of that digest only."""
    import policy_digest  # bench/ is on sys.path wherever meta is

    return {**policy_digest.current(), "scope": policy_digest.SCOPE}


def run_meta(settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """The commit (with ``dirty`` when the tree had uncommitted changes), the decision
    digest of the policy it runs, the UTC date, the machine and the benchmark's own
    settings."""
    commit = _git("rev-parse", "HEAD") or "unknown"
    # results being rewritten is what a run does; any other uncommitted change is "dirty"
    dirty = bool(
        _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/results")
    )
    return {
        "commit": commit,
        "dirty": dirty,
        "decisions": decision_digest(),
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {
            "cpu": _cpu_model(),
            "cpus": os.cpu_count(),
            "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
        },
        "settings": dict(settings or {}),
    }


def meta_line(meta: dict[str, Any]) -> str:
    """One line for a doc: commit (short), date and machine of a result."""
    m = meta.get("machine", {})
    commit = str(meta.get("commit", "unknown"))[:10] + (" (dirty)" if meta.get("dirty") else "")
    return (
        f"commit `{commit}`, {meta.get('date', '?')}, {m.get('cpus', '?')} cores "
        f"({m.get('cpu', '?')}), {m.get('ram_gib', '?')} GiB RAM, Python {m.get('python', '?')}"
    )
