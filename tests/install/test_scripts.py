"""scripts/test's own rules: a phase that fails fails the run, and collecting nothing in
every phase is a failure (pytest's exit status 5 never passes)."""

from __future__ import annotations

import subprocess

import pytest

from .support import ROOT


def _combined(*codes: int) -> tuple[str, str]:
    script = f". scripts/test-lib.sh; combined_rc {' '.join(map(str, codes))}"
    done = subprocess.run(
        ["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True
    )
    return done.stdout.strip(), done.stderr


@pytest.mark.parametrize(
    ("codes", "expected"),
    [
        ((0, 0), "0"),
        ((0, 5), "0"),  # one phase selected nothing: the other ran tests
        ((5, 0), "0"),
        ((5, 5), "1"),  # nothing ran at all
        ((5,), "1"),
        ((1, 0), "1"),
        ((0, 2), "2"),
        ((5, 3), "3"),
        ((4, 1), "4"),  # the first failure's status
    ],
)
def test_the_phases_exit_status(codes: tuple[int, ...], expected: str) -> None:
    out, err = _combined(*codes)
    assert out == expected
    assert ("collected no tests" in err) == (set(codes) == {5})


def test_pytest_rc_reports_the_status_and_keeps_stdout_for_it() -> None:
    script = (
        ". scripts/test-lib.sh; set -e; rc=$(pytest_rc bash -c 'echo noise; exit 3'); echo rc=$rc"
    )
    done = subprocess.run(
        ["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True
    )
    assert done.stdout == "rc=3\n" and done.stderr == "noise\n"
