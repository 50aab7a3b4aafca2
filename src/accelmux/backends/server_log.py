"""A supervised server's output: a ring buffer in memory and a file under the data dir.

What is kept in memory reaches ``/admin/status`` (``log_tail``) and error messages: a
child may print its environment, so secrets are masked there (:mod:`accelmux.redact`).
The file (``<data_dir>/logs/<service>.log``, readable by the daemon's user only) keeps
the raw output. accelmux's own lines about the server start with ``accelmux:``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import deque
from pathlib import Path
from typing import IO

from accelmux.redact import redact


class ServerLog:
    def __init__(self, path: Path | None, lines: int) -> None:
        self.path = path
        self.lines: deque[str] = deque(maxlen=lines)
        self._file: IO[str] | None = None

    def open(self) -> None:
        if self.path is None or self._file is not None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            self._file = os.fdopen(fd, "a", encoding="utf-8", buffering=1)
        except OSError:
            self._file = None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def write(self, line: str) -> None:
        self.lines.append(redact(line))
        if self._file is not None:
            with contextlib.suppress(OSError, ValueError):
                self._file.write(line + "\n")

    async def read_from(self, proc: asyncio.subprocess.Process) -> None:
        """Copy the process's output, line by line, until it closes."""
        stream = proc.stdout
        if stream is None:
            return
        while True:
            try:
                raw = await stream.readline()
            except ValueError:  # a line longer than the stream limit
                raw = await stream.read(65536)
            if not raw:
                return
            self.write(raw.decode("utf-8", "replace").rstrip())

    def tail(self, n: int = 5) -> str:
        """The last lines, for an error message ('' when there are none)."""
        lines = list(self.lines)[-n:]
        return ("; last output: " + " | ".join(lines)) if lines else ""
