"""The daemon's side of one inference worker: start it, talk to it, notice its death.

:class:`WorkerClient` starts ``python -m accelmux.worker.main`` with one end of a Unix
socket pair, multiplexes concurrent calls and streams over it by request id, polls the
worker's memory report every ``poll_s`` seconds, and, when the worker dies without
being asked to, fails every call in flight with
:class:`~accelmux.errors.BackendCrashedError` and tells its listeners (each hosted
service's backend, which reports BackendCrashed to the Manager). The next load starts a
fresh worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from accelmux.errors import BackendCrashedError, BackendError, BackendTimeoutError, RequestError
from accelmux.worker import protocol

log = logging.getLogger("accelmux.worker")

DeathListener = Callable[[str], None]
_END = object()


def _raise_for(header: dict[str, Any]) -> None:
    if header.get("type") != "error":
        return
    message = str(header.get("error", "worker error"))
    kind = header.get("error_type")
    if kind == "request":
        raise RequestError(
            message, field=header.get("field"), status=int(header.get("status") or 400)
        )
    if kind == "crashed":
        raise BackendCrashedError(message)
    raise BackendError(message)


class WorkerClient:
    """One worker process and the connection to it."""

    def __init__(
        self,
        name: str,
        data_dir: Path,
        *,
        startup_timeout_s: float = 60.0,
        poll_s: float = 1.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.data_dir = data_dir
        self.startup_timeout_s = startup_timeout_s
        self.poll_s = poll_s
        self.env = env
        self.pid: int | None = None
        self.starts = 0
        self.memory: dict[str, Any] = {}
        self.last_exit: str | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._poll_task: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[tuple[dict[str, Any], bytes]]] = {}
        self._streams: dict[int, asyncio.Queue[Any]] = {}
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()
        self._listeners: list[DeathListener] = []
        self._closing = False

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._writer is not None and self._proc is not None and self._proc.returncode is None

    def add_death_listener(self, listener: DeathListener) -> None:
        self._listeners.append(listener)

    async def ensure_started(self) -> None:
        async with self._lock:
            if self.alive:
                return
            await self._start()

    async def _start(self) -> None:
        self._closing = False
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "accelmux.worker.main",
                "--fd",
                str(child.fileno()),
                "--data-dir",
                str(self.data_dir),
                pass_fds=(child.fileno(),),
                stdin=asyncio.subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # a Ctrl-C in the terminal reaches the daemon only
            )
        finally:
            child.close()
        reader, writer = await asyncio.open_unix_connection(sock=parent)
        try:
            header, _ = await asyncio.wait_for(protocol.read_frame(reader), self.startup_timeout_s)
        except (TimeoutError, asyncio.IncompleteReadError, protocol.ProtocolError) as exc:
            writer.close()
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise BackendError(f"inference worker {self.name} did not start: {exc!r}") from None
        if header.get("type") != "hello":
            raise BackendError(f"inference worker {self.name} sent {header!r} first")
        self._proc, self._writer = proc, writer
        self.pid = int(header.get("pid", proc.pid))
        self.starts += 1
        self._reader_task = asyncio.create_task(self._read_loop(reader, proc))
        if self._poll_task is None or self._poll_task.done():
            self._poll_task = asyncio.create_task(self._poll_loop())
        log.info("inference worker %s started (pid %s)", self.name, self.pid)

    async def close(self) -> None:
        """Stop the worker: close its socket (it exits), kill it if it lingers."""
        self._closing = True
        if self._poll_task is not None:
            self._poll_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poll_task
            self._poll_task = None
        writer, proc = self._writer, self._proc
        self._writer = None
        if writer is not None:
            writer.close()
        if proc is not None and proc.returncode is None:
            try:
                await asyncio.wait_for(proc.wait(), 10.0)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        if self._reader_task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader_task
        self.pid = None

    # -- reading --------------------------------------------------------------------------
    async def _read_loop(self, reader: asyncio.StreamReader, proc: Any) -> None:
        error = "connection closed"
        try:
            while True:
                header, blob = await protocol.read_frame(reader)
                rid = int(header.get("id", 0))
                queue = self._streams.get(rid)
                if queue is not None:
                    if header.get("type") != "chunk":
                        self._streams.pop(rid, None)
                    queue.put_nowait((header, blob))
                    continue
                future = self._pending.pop(rid, None)
                if future is not None and not future.done():
                    future.set_result((header, blob))
        except asyncio.CancelledError:
            raise
        except (asyncio.IncompleteReadError, ConnectionError, protocol.ProtocolError) as exc:
            error = f"{type(exc).__name__}"
        finally:
            await self._died(proc, error)

    async def _died(self, proc: Any, error: str) -> None:
        if self._proc is proc:
            self._writer = None
        if proc.returncode is None and self._closing:  # asked to stop: give it a moment
            with contextlib.suppress(ProcessLookupError, TimeoutError):
                await asyncio.wait_for(proc.wait(), 10.0)
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        code = proc.returncode
        reason = f"inference worker {self.name} (pid {proc.pid}) exited with code {code} ({error})"
        self.last_exit = reason
        crash = BackendCrashedError(reason)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(crash)
        self._pending.clear()
        for queue in self._streams.values():
            queue.put_nowait(crash)
        self._streams.clear()
        self.memory = {}
        if not self._closing:
            log.warning("%s", reason)
            for listener in list(self._listeners):
                try:
                    listener(reason)
                except Exception as exc:  # one listener must not stop the others
                    log.warning("crash listener failed: %s", exc)

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            if not self.alive:
                continue
            with contextlib.suppress(BackendError, TimeoutError):
                header, _ = await self.call({"op": "memory"}, timeout=10.0)
                self.memory = header

    # -- calls ----------------------------------------------------------------------------
    def _send(self, header: dict[str, Any], blob: bytes) -> None:
        writer = self._writer
        if writer is None:
            raise BackendCrashedError(self.last_exit or f"inference worker {self.name} is down")
        writer.write(protocol.encode(header, blob))

    async def call(
        self, header: dict[str, Any], blob: bytes = b"", *, timeout: float | None = None
    ) -> tuple[dict[str, Any], bytes]:
        """Send one request, wait for its reply; worker errors raise (see _raise_for)."""
        rid = next(self._ids)
        future: asyncio.Future[tuple[dict[str, Any], bytes]] = (
            asyncio.get_running_loop().create_future()
        )
        self._pending[rid] = future
        try:
            self._send({**header, "id": rid}, blob)
            if timeout is None:
                reply, data = await future
            else:
                reply, data = await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise BackendTimeoutError(f"{header.get('op')} took longer than {timeout} s") from None
        except asyncio.CancelledError:
            self.cancel(rid)
            raise
        finally:
            self._pending.pop(rid, None)
        _raise_for(reply)
        return reply, data

    def cancel(self, rid: int) -> None:
        with contextlib.suppress(BackendError, ConnectionError):
            self._send({"op": "cancel", "id": 0, "target": rid}, b"")

    async def open_stream(
        self, header: dict[str, Any], blob: bytes = b""
    ) -> tuple[AsyncIterator[bytes], asyncio.Future[dict[str, Any]]]:
        """Start a streamed call; returns (chunks, the final header once the stream ends).

        The first frame is awaited here, so an error before any output raises now.
        """
        rid = next(self._ids)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._streams[rid] = queue
        self._send({**header, "id": rid, "stream": True}, blob)
        final: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        try:
            first = await queue.get()
        except asyncio.CancelledError:
            self._streams.pop(rid, None)
            self.cancel(rid)
            raise
        if isinstance(first, BaseException):
            raise first
        head, data = first
        if head.get("type") != "chunk":
            _raise_for(head)
            final.set_result(head)

        async def chunks() -> AsyncIterator[bytes]:
            done = head.get("type") != "chunk"
            try:
                if done:
                    return
                yield data
                while True:
                    item = await queue.get()
                    if isinstance(item, BaseException):
                        raise item
                    h, blob_ = item
                    if h.get("type") == "chunk":
                        yield blob_
                        continue
                    done = True
                    _raise_for(h)
                    final.set_result(h)
                    return
            finally:
                if not done:
                    self._streams.pop(rid, None)
                    self.cancel(rid)
                if not final.done():
                    final.cancel()

        return chunks(), final
