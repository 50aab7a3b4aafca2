"""A child process kept running: started again when it exits, with a growing pause.

Cluster mode keeps each moving part in a process of its own so that one part's death
never takes another down: a node's daemon, and each link to Ray (Ray ends a process
that has lost its cluster for a minute, and prints its own diagnostics; neither may
reach the daemon or the user's terminal). :class:`Kept` runs one such child:

* through :mod:`accelmux.backends.child_launch`, so it dies with its parent (a killed
  parent leaves no orphan holding a port);
* its standard output read as JSON lines (its reports), its standard error appended to a
  log file (its standard output too, for a child that does not report): Ray's noise
  ends up there, not in the terminal;
* started again after it exits, after a pause that doubles from ``backoff_s`` up to
  ``max_backoff_s`` and starts over once a run lasted ``steady_s``.

What it does is told through ``on_report`` (each JSON line) and ``on_exit`` (its exit
status), so the caller writes the one line a user sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from accelmux.backends import child_launch

log = logging.getLogger("accelmux.cluster")


def launch_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` started so that it dies with this process."""
    return [sys.executable, "-I", child_launch.__file__, "--parent", str(os.getpid()), "--", *argv]


class Kept:
    """One child process, started again whenever it ends, until :meth:`stop`."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        on_report: Callable[[dict[str, Any]], None] = lambda _: None,
        on_exit: Callable[[int, float], None] = lambda _code, _ran: None,
        env: dict[str, str] | None = None,
        backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
        steady_s: float = 60.0,
        stdin: bool = False,
        reports: bool = True,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.on_report = on_report
        self.on_exit = on_exit
        self.env = env
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.steady_s = steady_s
        self.stdin = stdin
        self.reports = reports
        self.proc: asyncio.subprocess.Process | None = None
        self.starts = 0
        self._stopping = False
        self._wake = asyncio.Event()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.returncode is None else None

    async def run(self) -> None:
        """Keep the child running until :meth:`stop`."""
        pause = self.backoff_s
        loop = asyncio.get_running_loop()
        while not self._stopping:
            started = loop.time()
            code = await self._run_once()
            ran = loop.time() - started
            if self._stopping:
                return
            self.on_exit(code, ran)
            pause = self.backoff_s if ran >= self.steady_s else pause
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), pause)
            pause = min(self.max_backoff_s, pause * 2)

    def restart_now(self) -> None:
        """Skip the pause before the next start (the cause it waited on is gone)."""
        self._wake.set()

    async def _run_once(self) -> int:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as err:
            try:
                self.proc = await asyncio.create_subprocess_exec(
                    *launch_argv(self.argv),
                    stdin=asyncio.subprocess.PIPE if self.stdin else asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE if self.reports else err,
                    stderr=err,
                    env=self.env,
                    limit=2**20,
                )
            except OSError as exc:
                log.warning("%s: cannot start: %s", self.name, exc)
                return 127
        self.starts += 1
        proc = self.proc
        if proc.stdout is None:  # not a reporting child: its output is in the log
            return await proc.wait()
        while True:
            try:
                line = await proc.stdout.readline()
            except (ValueError, asyncio.LimitOverrunError):  # a line past 1 MiB: not ours
                continue
            if not line:
                break
            self._report(line)
        return await proc.wait()

    def _report(self, line: bytes) -> None:
        try:
            report = json.loads(line)
        except ValueError:
            return  # stray output (a library's print): the log has the real errors
        if isinstance(report, dict):
            try:
                self.on_report(report)
            except Exception:  # a bad report must not stop the keeping
                log.exception("%s: handling a report failed", self.name)

    def send(self, data: dict[str, Any]) -> None:
        """One JSON line to the child's standard input (``stdin`` children only)."""
        proc = self.proc
        if proc is None or proc.stdin is None or proc.returncode is not None:
            return
        with contextlib.suppress(ConnectionError, RuntimeError):
            proc.stdin.write(json.dumps(data).encode() + b"\n")

    def signal(self, sig: int) -> None:
        proc = self.proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)

    async def stop(self, timeout_s: float = 15.0) -> None:
        """End the child (SIGTERM, then SIGKILL after ``timeout_s``) and keep it ended."""
        self._stopping = True
        self._wake.set()
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        self.signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            self.signal(signal.SIGKILL)
            await proc.wait()
