"""The repository holds sources only: no file a running daemon or test writes is tracked.

``accelmux serve`` keeps its jobs database, locks and logs under ``data_dir``
(``./accelmux-data`` by default, so under a checkout when run from it); a tracked copy
would turn every run into a change to commit and ship one machine's job history.
"""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Patterns of files written at run time (fnmatch, against the path from the root).
RUNTIME_PATTERNS = ("*.sqlite3", "*.sqlite3-*", "*.lock", "*.log", "accelmux-data/*")


def _tracked_files() -> list[str]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    probe = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--show-toplevel"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0 or Path(probe.stdout.strip()).resolve() != ROOT:
        pytest.skip("not a git checkout of accelmux")
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True
    )
    return [name for name in listed.stdout.decode().split("\0") if name]


def test_no_runtime_file_is_tracked() -> None:
    tracked = _tracked_files()
    runtime = sorted(
        name
        for name in tracked
        if any(fnmatch.fnmatch(name, pattern) for pattern in RUNTIME_PATTERNS)
    )
    assert not runtime, f"runtime files are tracked (git rm --cached them): {runtime}"


def test_the_default_data_dir_is_ignored() -> None:
    _tracked_files()  # skips outside a git checkout
    ignored = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", "-q", "--no-index", "accelmux-data/logs/x.log"],
        check=False,
    )
    assert ignored.returncode == 0, ".gitignore does not list accelmux-data/"
