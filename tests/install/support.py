"""Helpers for the install tests: systemd's own checker, a clean environment."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXPOSURE = re.compile(r"Overall exposure level for \S+: (?P<score>[\d.]+) (?P<label>\w+)")


def systemd_analyze() -> str:
    """The ``systemd-analyze`` binary; fails (skips with ACCELMUX_SKIP_MODELS=1) without."""
    found = shutil.which("systemd-analyze")
    if found is None:
        message = "systemd-analyze is missing: apt-get install systemd (scripts/test does)"
        if os.environ.get("ACCELMUX_SKIP_MODELS") == "1":
            pytest.skip(message)
        pytest.fail(message)
    return found


def verify(unit_file: Path, *, user: bool = False) -> subprocess.CompletedProcess[str]:
    """``systemd-analyze verify`` on ``unit_file`` (its drop-ins beside it are read too)."""
    argv = [systemd_analyze(), *(["--user"] if user else []), "verify", str(unit_file)]
    env = dict(os.environ)
    if user:  # the user manager needs a runtime directory (none in a service or container)
        runtime = unit_file.parent / "runtime"
        runtime.mkdir(mode=0o700, exist_ok=True)
        env["XDG_RUNTIME_DIR"] = str(runtime)
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, env=env)


def exposure(unit_file: Path) -> tuple[float, str]:
    """``systemd-analyze security --offline``'s overall exposure score and its label."""
    done = subprocess.run(
        [systemd_analyze(), "security", "--offline=true", "--no-pager", str(unit_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=unit_file.parent,
    )
    found = EXPOSURE.search(done.stdout + done.stderr)
    assert found, done.stdout + done.stderr
    return float(found.group("score")), found.group("label")


def service_cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m accelmux service ARGS`` of the checkout, in ``cwd``, with ``env`` added
    to a clean environment."""
    return subprocess.run(
        [sys.executable, "-m", "accelmux", "service", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=clean_env(PYTHONPATH=str(ROOT / "src"), **env),
        timeout=60,
        check=False,
    )


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without what points Python at the checkout or a virtualenv."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "NOTIFY_SOCKET")
    }
    env.update(extra)
    return env


def command_line(unit_file: Path) -> list[str]:
    """The command line systemd parsed from the unit (its debug dump, shell-quoted)."""
    env = {"SYSTEMD_LOG_LEVEL": "debug", "PATH": os.environ.get("PATH", "")}
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit_file)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    found = re.search(r"Command Line: (.*)", done.stdout + done.stderr)
    assert done.returncode == 0 and found, done.stderr[-2000:]
    # the dump shows $$ as written: systemd turns it into $ when it runs the command
    return [word.replace("$$", "$") for word in shell_words(found.group(1))]


def shell_words(line: str) -> list[str]:
    """Words of systemd's quoted dump: blanks separate, double quotes group, a backslash
    takes the next character as it is (in quotes or not)."""
    words: list[str] = []
    word: list[str] | None = None
    quoted = escaped = False
    for char in line:
        if escaped:
            word = (word or []) + [char]
            escaped = False
        elif char == "\\":
            escaped = True
            word = word or []
        elif char == '"':
            quoted = not quoted
            word = word or []
        elif char == " " and not quoted:
            if word is not None:
                words.append("".join(word))
            word = None
        else:
            word = (word or []) + [char]
    if word is not None:
        words.append("".join(word))
    return words
