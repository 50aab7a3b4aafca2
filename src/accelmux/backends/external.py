"""A supervised external OpenAI-compatible server (llama-server, vLLM, whisper, TTS...).

Started from an argv list (never a shell string) templated with ``{port}``, ``{host}``,
``{ctx_size}``, ``{parallel}``, ``{kv_pool_bytes}``, ``{model}`` and ``{gpu}``; in its own
process group (``start_new_session``) with the service's env, including
``CUDA_VISIBLE_DEVICES`` for an NVIDIA device. Up when ``health_path`` answers 200.
Stopped with SIGTERM to the group, SIGKILL after ``stop_grace_s``. Its exit while loaded
is reported through the crash callback (the Manager restarts it with backoff). Its output
is kept in a ring buffer and appended to ``<data_dir>/logs/<service>.log``. Requests are
proxied to it; streams pass through chunk by chunk.

A Resize cannot change a running server's context: it is recorded and applied at the
next start (``resize`` returns False).

The child's pid and start time are kept in ``<data_dir>/run/<service>.pid`` while it
runs. If accelmux itself was killed (SIGKILL, the OOM killer), the next start finds that
file and stops the leftover server group before starting a new one, so an orphan never
keeps holding accelerator memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import time
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO, Any

import aiohttp
import psutil
from yarl import URL

from accelmux.backends.base import BackendRequest, BackendResponse, CrashCallback, LoadReport
from accelmux.config.backends import ExternalBackendConfig
from accelmux.errors import BackendCrashedError, BackendError, BackendTimeoutError
from accelmux.redact import redact


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def template_argv(argv: list[str], values: dict[str, object]) -> list[str]:
    """Fill ``{name}`` placeholders; an unknown name is a BackendError naming it."""
    out = []
    for arg in argv:
        try:
            out.append(arg.format_map(values))
        except (KeyError, IndexError, ValueError) as exc:
            raise BackendError(
                f"argv element {arg!r}: unknown or malformed placeholder ({exc}); "
                f"known: {', '.join(sorted(values))} (write {{{{ for a literal brace)"
            ) from None
    return out


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class ExternalBackend:
    """Supervises one external server process and proxies requests to it."""

    def __init__(
        self,
        service: str,
        model: str,
        cfg: ExternalBackendConfig,
        *,
        kv_bytes_per_token: int = 0,
        concurrency: int = 1,
        gpu_index: int | None = None,
        data_dir: Path | None = None,
    ) -> None:
        self.service = service
        self.model = model
        self.cfg = cfg
        self.kv_bytes_per_token = kv_bytes_per_token
        self.concurrency = concurrency
        self.gpu_index = gpu_index
        self.log_path = (data_dir / "logs" / f"{service}.log") if data_dir else None
        self.pid_path = (data_dir / "run" / f"{service}.pid") if data_dir else None
        self.logs: deque[str] = deque(maxlen=cfg.log_lines)
        self.port: int | None = None
        self.kv_pool_bytes = 0
        self.starts = 0
        self.last_exit: int | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._log_file: IO[str] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self._on_crash: CrashCallback | None = None
        self._stopping = False
        self._loaded = False
        self._urls: dict[str, URL] = {}

    # ---- lifecycle ------------------------------------------------------------------
    def _values(self, port: int) -> dict[str, object]:
        ctx = (
            self.kv_pool_bytes // self.kv_bytes_per_token
            if self.kv_bytes_per_token and self.kv_pool_bytes
            else self.cfg.ctx_size
        )
        return {
            "port": port,
            "host": self.cfg.host,
            "ctx_size": max(1, ctx),
            "parallel": self.concurrency,
            "kv_pool_bytes": self.kv_pool_bytes,
            "model": self.model,
            "gpu": self.gpu_index if self.gpu_index is not None else "",
        }

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.gpu_index is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(self.gpu_index)
        env.update(self.cfg.env)
        return env

    def _session_get(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
                timeout=aiohttp.ClientTimeout(total=self.cfg.request_timeout_s),
            )
        return self._session

    async def load(
        self, *, weights_bytes: int, runtime_bytes: int, kv_pool_bytes: int
    ) -> LoadReport:
        await self._stop_process()
        self._open_log()
        if self.starts == 0:
            await self._reap_leftover()
        self.kv_pool_bytes = kv_pool_bytes
        port = self.cfg.port or free_port(self.cfg.host)
        argv = template_argv(self.cfg.argv, self._values(port))
        self._log(f"accelmux: starting {argv[0]} on port {port}")
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=self._env(),
                start_new_session=True,
            )
        except OSError as exc:
            raise BackendError(f"{self.service}: cannot start {argv[0]!r}: {exc}") from None
        self.port = port
        self._urls = {}
        self.starts += 1
        self._write_pid(self._proc.pid)
        self._stopping = False
        proc = self._proc
        self._tasks = [asyncio.create_task(self._read_logs(proc))]
        try:
            await self._wait_healthy(proc)
        except BaseException:
            await self._stop_process()
            raise
        self._loaded = True
        self._tasks.append(asyncio.create_task(self._watch(proc)))
        return LoadReport()

    async def _wait_healthy(self, proc: asyncio.subprocess.Process) -> None:
        url = f"http://{self.cfg.host}:{self.port}{self.cfg.health_path}"
        deadline = time.monotonic() + self.cfg.startup_timeout_s
        session = self._session_get()
        delay = 0.02
        while True:
            if proc.returncode is not None:
                raise BackendCrashedError(
                    f"{self.service}: exited with code {proc.returncode} while starting"
                    f"{self._tail()}"
                )
            try:
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    if resp.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise BackendTimeoutError(
                    f"{self.service}: not healthy after {self.cfg.startup_timeout_s:.0f}s"
                    f"{self._tail()}"
                )
            await asyncio.sleep(delay)
            delay = min(0.5, delay * 1.5)

    async def _watch(self, proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        self.last_exit = code
        if self._stopping or proc is not self._proc:
            return
        self._loaded = False
        self._log(f"accelmux: process exited with code {code}")
        if self._on_crash is not None:
            self._on_crash(f"{self.service}: process exited with code {code}{self._tail()}")

    async def unload(self) -> None:
        await self._stop_process()
        self._loaded = False

    async def _stop_process(self) -> None:
        proc = self._proc
        self._stopping = True
        if proc is not None:
            if proc.returncode is None:
                self._signal(proc, signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), self.cfg.stop_grace_s)
                except TimeoutError:
                    self._log("accelmux: no exit after SIGTERM, sending SIGKILL")
                    self._signal(proc, signal.SIGKILL)
                    await proc.wait()
            self.last_exit = proc.returncode
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        for task in self._tasks:
            if task is not asyncio.current_task():
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._tasks = []
        if proc is not None:
            self._remove_pid()
        self._proc = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    # ---- leftovers of a previous run ---------------------------------------------------
    def _write_pid(self, pid: int) -> None:
        if self.pid_path is None:
            return
        try:
            started = psutil.Process(pid).create_time()
            self.pid_path.parent.mkdir(parents=True, exist_ok=True)
            self.pid_path.write_text(f"{pid} {started}\n")
        except (OSError, psutil.Error):
            pass

    def _remove_pid(self) -> None:
        if self.pid_path is not None:
            with contextlib.suppress(OSError):
                self.pid_path.unlink()

    async def _reap_leftover(self) -> None:
        """Stop a server group a killed accelmux left running (same pid AND start time)."""
        if self.pid_path is None or not self.pid_path.exists():
            return
        try:
            pid_text, started_text = self.pid_path.read_text().split()
            pid, started = int(pid_text), float(started_text)
            proc = psutil.Process(pid)
            if abs(proc.create_time() - started) > 0.01:
                raise ProcessLookupError  # the pid was reused by another program
        except (OSError, ValueError, psutil.Error):
            self._remove_pid()
            return
        self._log(f"accelmux: stopping leftover server pid {pid} from a previous run")
        for sig, wait_s in ((signal.SIGTERM, self.cfg.stop_grace_s), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
            deadline = time.monotonic() + wait_s
            while (
                time.monotonic() < deadline
                and proc.is_running()
                and (proc.status() != psutil.STATUS_ZOMBIE)
            ):
                await asyncio.sleep(0.05)
            if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
                break
        self._remove_pid()

    @staticmethod
    def _signal(proc: asyncio.subprocess.Process, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)  # the child leads its own session and group

    async def resize(self, kv_pool_bytes: int) -> bool:
        self.kv_pool_bytes = kv_pool_bytes
        return False

    def set_crash_callback(self, callback: CrashCallback) -> None:
        self._on_crash = callback

    def memory_bytes(self) -> int | None:
        return None

    def pids(self) -> list[int]:
        proc = self._proc
        return [proc.pid] if proc is not None and proc.returncode is None else []

    def describe(self) -> dict[str, Any]:
        proc = self._proc
        return {
            "type": "external",
            "program": self.cfg.argv[0],
            "pid": proc.pid if proc is not None and proc.returncode is None else None,
            "port": self.port,
            "starts": self.starts,
            "last_exit": self.last_exit,
            "log_file": str(self.log_path) if self.log_path else None,
            "log_tail": list(self.logs)[-10:],
        }

    async def close(self) -> None:
        await self._stop_process()
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ---- logs ---------------------------------------------------------------------
    def _open_log(self) -> None:
        if self.log_path is None or self._log_file is not None:
            return
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            self._log_file = os.fdopen(fd, "a", encoding="utf-8", buffering=1)
        except OSError:
            self._log_file = None

    def _log(self, line: str) -> None:
        # What is kept in memory reaches /admin/status (log_tail) and error messages: a
        # child may print its environment, so secrets are masked there. The log file
        # under data_dir (readable by the daemon's user only) keeps the raw output.
        self.logs.append(redact(line))
        if self._log_file is not None:
            with contextlib.suppress(OSError, ValueError):
                self._log_file.write(line + "\n")

    async def _read_logs(self, proc: asyncio.subprocess.Process) -> None:
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
            self._log(raw.decode("utf-8", "replace").rstrip())

    def _tail(self, n: int = 5) -> str:
        lines = list(self.logs)[-n:]
        return ("; last output: " + " | ".join(lines)) if lines else ""

    # ---- requests ------------------------------------------------------------------
    def _payload(self, request: BackendRequest) -> tuple[bytes | aiohttp.FormData, dict[str, str]]:
        upstream_model = self.cfg.upstream_model
        if request.files:
            form = aiohttp.FormData()
            for key, value in request.body.items():
                if key.startswith("_"):
                    continue
                form.add_field(
                    key, upstream_model if key == "model" and upstream_model else str(value)
                )
            for key, data in request.files.items():
                name, ctype = request.file_info.get(key, (f"{key}.bin", "application/octet-stream"))
                form.add_field(key, data, filename=name, content_type=ctype)
            return form, {}
        if upstream_model or not request.raw:
            body = {k: v for k, v in request.body.items() if not k.startswith("_")}
            if upstream_model:
                body["model"] = upstream_model
            return json.dumps(body).encode(), {"Content-Type": "application/json"}
        return request.raw, {"Content-Type": request.content_type}

    async def handle(self, request: BackendRequest) -> BackendResponse:
        if not self._loaded or self.port is None:
            raise BackendCrashedError(f"{self.service}: external server is not running")
        url = self._urls.get(request.endpoint)
        if url is None:
            url = self._urls[request.endpoint] = URL(
                f"http://{self.cfg.host}:{self.port}{request.endpoint}"
            )
        data, headers = self._payload(request)
        session = self._session_get()
        try:
            resp = await session.post(url, data=data, headers=headers)
        except (aiohttp.ClientError, OSError) as exc:
            raise BackendCrashedError(f"{self.service}: upstream unreachable: {exc}") from None
        except TimeoutError:
            raise BackendTimeoutError(f"{self.service}: upstream timed out") from None
        content_type = resp.headers.get("Content-Type", "application/json")
        if request.stream and resp.status == 200:
            return BackendResponse(
                status=resp.status,
                content_type=content_type,
                stream=self._relay(resp),
                release=resp.release,
            )
        try:
            body = await resp.read()
        except (aiohttp.ClientError, OSError) as exc:
            raise BackendCrashedError(f"{self.service}: upstream broke off: {exc}") from None
        except TimeoutError:
            raise BackendTimeoutError(f"{self.service}: upstream timed out") from None
        finally:
            resp.release()
        return BackendResponse(status=resp.status, content_type=content_type, body=body)

    async def _relay(self, resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        try:
            async for chunk in resp.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, OSError) as exc:
            raise BackendCrashedError(f"{self.service}: stream broke off: {exc}") from None
        finally:
            resp.release()
