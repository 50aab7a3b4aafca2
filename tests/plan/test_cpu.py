"""The compute probe: threads that want the CPU are counted whether or not they get it."""

from __future__ import annotations

import subprocess
import sys
import time

from accelmux.history.cpu import CpuProbe, parse_ticks, procs_running, runnable_threads


def test_a_spinning_managed_process_counts_as_one_runnable_thread() -> None:
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        probe = CpuProbe(lambda: [child.pid], ["host"], rate_hz=20)
        try:
            assert probe("host").run_managed is None  # the first call starts the span
            time.sleep(1.5)
            figures = probe("host")
        finally:
            probe.close()
        assert figures.run_managed is not None and figures.run_total is not None
        assert 0.7 <= figures.run_managed <= 1.3, figures
        assert figures.run_total >= figures.run_managed
        assert figures.cpu_managed is not None and figures.cpu_managed > 0.1
        ticks = parse_ticks(figures.ticks)
        assert len(ticks) >= 10 and all(m <= n for _, m, n in ticks)
        assert sorted(t for t, _, _ in ticks) == [t for t, _, _ in ticks]
        assert probe("gpu").run_managed is None  # not a host device: not measured
    finally:
        child.kill()
        child.wait()


def test_counting_reads_proc() -> None:
    assert (procs_running() or 0) >= 1
    assert runnable_threads([2**22 + 12345]) == 0  # no such process: nothing, no error
