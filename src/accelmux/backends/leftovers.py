"""The pidfile of a supervised server, and stopping what a killed accelmux left of it.

While a server runs, ``<data_dir>/run/<service>.pid`` holds its pid and start time. The
server itself dies with accelmux (its death signal, :mod:`.child_launch`); processes it
started (a server's workers) may not. The next start reads that file and stops the old
process group's members: found by process group (the server's pid, as it led its own
session) and start time (not before the server's), so a reused pid is never signalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil


def group_members(pgid: int, started: float) -> list[psutil.Process]:
    """Live processes of group ``pgid`` started no earlier than ``started`` (the leader's
    start time): the leftovers of that group, never a later owner of a reused pid."""
    out = []
    for proc in psutil.process_iter(["create_time"]):
        try:
            if os.getpgid(proc.pid) != pgid:
                continue
            if proc.info["create_time"] + 0.01 < started:
                continue
        except (OSError, psutil.Error):
            continue
        if proc.pid == pgid and abs(proc.info["create_time"] - started) > 0.01:
            return []  # the pid was reused by another program that leads its own group
        if alive(proc):
            out.append(proc)
    return out


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class PidFile:
    """``<data_dir>/run/<service>.pid``, or nothing when there is no data dir."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def write(self, pid: int) -> None:
        if self.path is None:
            return
        try:
            started = psutil.Process(pid).create_time()
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="ascii") as out:
                out.write(f"{pid} {started}\n")
        except (OSError, psutil.Error):
            pass

    def remove(self) -> None:
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()

    async def reap(self, stop_grace_s: float, log: Callable[[str], None]) -> None:
        """Stop what a killed accelmux left of the server's process group."""
        if self.path is None or not self.path.exists():
            return
        try:
            pid_text, started_text = self.path.read_text().split()
            pid, started = int(pid_text), float(started_text)
        except (OSError, ValueError):
            self.remove()
            return
        members = group_members(pid, started)
        if not members:
            self.remove()
            return
        log(
            f"accelmux: stopping leftover server pid {pid} from a previous run "
            f"({len(members)} process(es) left in its group)"
        )
        for sig, wait_s in ((signal.SIGTERM, stop_grace_s), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and any(alive(p) for p in members):
                await asyncio.sleep(0.05)
            if not any(alive(p) for p in members):
                break
        self.remove()
