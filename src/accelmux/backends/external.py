"""A supervised external OpenAI-compatible server (llama-server, vLLM, whisper, TTS...).

Started from an argv list (never a shell string) templated with ``{port}``, ``{host}``,
``{ctx_size}``, ``{parallel}``, ``{kv_pool_bytes}``, ``{model}`` and ``{gpu}``; in its own
process group (``start_new_session``) with the service's env, including
``CUDA_VISIBLE_DEVICES`` for an NVIDIA device. Up when ``health_path`` answers 200.
Stopped with SIGTERM to the group, SIGKILL after ``stop_grace_s``.

It is started through :mod:`accelmux.backends.child_launch`, which arms
``PR_SET_PDEATHSIG`` (SIGKILL when accelmux dies, even by SIGKILL) and, on a host-memory
device where the host allows, joins a cgroup v2 whose ``memory.max`` is the service's
ledger entry plus ``limit_margin`` (:mod:`accelmux.backends.limits`). What was limited,
or why nothing could be, is in ``describe()["limit"]``.

Measured (:mod:`accelmux.backends.process_meter`): the tree's resident bytes once healthy
are the load size reported to the calibrator (less the KV pool it was started with), and
each request's peak is the tree's growth while it ran plus the KV of the tokens it used
(from the answer's ``usage``). ``refresh()`` reads the server's ``metrics_path`` and
``slots_path`` (:mod:`accelmux.backends.server_metrics`). Its exit while loaded
is reported through the crash callback (the Manager restarts it with backoff). Its output
is kept in a ring buffer and appended to ``<data_dir>/logs/<service>.log``. Requests are
proxied to it; streams pass through chunk by chunk.

A Resize cannot change a running server's context: it is recorded and applied at the
next start (``resize`` returns False).

The child's pid and start time are kept in ``<data_dir>/run/<service>.pid`` while it
runs. If accelmux itself was killed (SIGKILL, the OOM killer), the next start finds that
file and stops the leftover server group before starting a new one, so an orphan never
keeps holding accelerator memory (:mod:`accelmux.backends.leftovers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO, Any

import aiohttp
from yarl import URL

from accelmux.backends import child_launch
from accelmux.backends.base import BackendRequest, BackendResponse, CrashCallback, LoadReport
from accelmux.backends.leftovers import PidFile
from accelmux.backends.limits import (
    MPS_LIMIT_ENV,
    CgroupSupport,
    gpu_memory_fraction,
    limit_bytes,
    make_service_cgroup,
    mps_in_use,
    mps_limit_value,
    remove_service_cgroup,
)
from accelmux.backends.process_meter import PeakTracker, ProcessTreeMeter
from accelmux.backends.server_metrics import argv_option, parse_server_metrics, parse_slots
from accelmux.config.backends import ExternalBackendConfig
from accelmux.core.specs import Capabilities
from accelmux.core.types import Tier
from accelmux.errors import BackendCrashedError, BackendError, BackendTimeoutError
from accelmux.redact import redact

#: ``"total_tokens": N`` in an answer's usage (the last one of a stream counts).
TOTAL_TOKENS = re.compile(rb'"total_tokens"\s*:\s*(\d+)')
#: Bytes of a streamed answer's end searched for its usage.
USAGE_TAIL_BYTES = 4096


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


def _uses(argv: list[str], placeholder: str) -> bool:
    return any("{" + placeholder + "}" in arg for arg in argv)


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
        workspace_bytes: int = 0,
        device_capacity: int | None = None,
        cgroup: CgroupSupport | None = None,
    ) -> None:
        self.service = service
        self.model = model
        self.cfg = cfg
        self.kv_bytes_per_token = kv_bytes_per_token
        self.concurrency = concurrency
        self.gpu_index = gpu_index
        self.log_path = (data_dir / "logs" / f"{service}.log") if data_dir else None
        self.pidfile = PidFile((data_dir / "run" / f"{service}.pid") if data_dir else None)
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
        self.workspace_bytes = workspace_bytes
        self.device_capacity = device_capacity
        self.cgroup_support = cgroup
        self.cgroup_path: Path | None = None
        self.limit_bytes = 0
        self.limit: dict[str, Any] = {"memory_max_bytes": None, "applied": []}
        self.meter = ProcessTreeMeter(gpu_index)
        self.peaks = PeakTracker(self._measure_now)
        self.resident_bytes: int | None = None
        self.load_seconds: float | None = None
        self.server_stats: dict[str, Any] = {}
        self.batch_size = argv_option(cfg.argv, "-b", "--batch-size")

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
            "memory_limit_bytes": self.limit_bytes,
            "gpu_memory_utilization": gpu_memory_fraction(self.limit_bytes, self.device_capacity),
        }

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.gpu_index is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(self.gpu_index)
        env.update(self.cfg.env)
        if mps_in_use(env) and MPS_LIMIT_ENV not in self.cfg.env and self.limit_bytes:
            env[MPS_LIMIT_ENV] = mps_limit_value(self.limit_bytes)
        return env

    # ---- limits ---------------------------------------------------------------------
    def _apply_limits(self, *, weights_bytes: int, runtime_bytes: int) -> None:
        """Derive the limit from the ledger entry; make the cgroup where possible."""
        self.limit_bytes = limit_bytes(
            weights=weights_bytes,
            runtime=runtime_bytes,
            kv_pool=self.kv_pool_bytes,
            workspace=self.workspace_bytes,
            concurrency=self.concurrency,
            margin=self.cfg.limit_margin,
        )
        applied: list[str] = []
        flags = [
            p for p in ("ctx_size", "parallel", "gpu_memory_utilization") if _uses(self.cfg.argv, p)
        ]
        if _uses(self.cfg.argv, "memory_limit_bytes"):
            flags.append("memory_limit_bytes")
        if flags:
            applied.append("flags: " + ", ".join("{" + f + "}" for f in flags))
        if mps_in_use(self._env_base()):
            applied.append(f"env: {MPS_LIMIT_ENV}")
        problem: str | None = None
        self.cgroup_path = None
        if self.gpu_index is not None:
            problem = "cgroup memory.max does not cover GPU memory"
        elif not self.cfg.memory_limit:
            problem = "memory_limit is off"
        elif self.cgroup_support is None or self.cgroup_support.parent is None:
            problem = self.cgroup_support.problem if self.cgroup_support else "not checked"
        else:
            try:
                self.cgroup_path = make_service_cgroup(
                    self.cgroup_support.parent, self.service, self.limit_bytes
                )
                applied.append(f"cgroup v2 memory.max at {self.cgroup_path}")
            except OSError as exc:
                problem = f"cannot make a cgroup under {self.cgroup_support.parent} ({exc})"
        if self.cgroup_path is not None:
            summary = f"memory.max {self.limit_bytes} bytes (cgroup v2)"
        elif mps_in_use(self._env_base()):
            summary = f"{MPS_LIMIT_ENV} {mps_limit_value(self.limit_bytes)} (CUDA MPS)"
        else:
            summary = f"none — {problem}"
            if flags:
                summary += "; its own flags carry the ledger's sizes"
        self.limit = {
            "memory_max_bytes": self.limit_bytes,
            "applied": applied,
            "cgroup": str(self.cgroup_path) if self.cgroup_path else None,
            "cgroup_problem": problem,
            "summary": summary,
        }

    def _env_base(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.cfg.env)
        return env

    def _launch_argv(self, argv: list[str]) -> list[str]:
        """The launcher that arms the death signal (and joins the cgroup), then execs."""
        launch = [sys.executable, "-I", child_launch.__file__, "--parent", str(os.getpid())]
        if self.cgroup_path is not None:
            launch += ["--cgroup", str(self.cgroup_path)]
        return [*launch, "--", *argv]

    # ---- measurement ------------------------------------------------------------------
    def _measure_now(self) -> int | None:
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return None
        return self.meter.measure(proc.pid)

    def _peak_bytes(self, growth: int, tail: bytes) -> int | None:
        """A request's peak for the calibrator: tree growth plus the KV of its tokens;
        None for an LLM answer that names no token count (KV cannot be told apart)."""
        if not self.kv_bytes_per_token:
            return growth
        found = TOTAL_TOKENS.findall(tail)
        if not found:
            return None
        return growth + int(found[-1]) * self.kv_bytes_per_token

    async def refresh(self) -> None:
        """Read the server's own metrics and slots (when configured) for the status page."""
        if not self._loaded or self.port is None:
            self.server_stats = {}
            return
        stats: dict[str, Any] = {}
        session = self._session_get()
        base = f"http://{self.cfg.host}:{self.port}"
        timeout = aiohttp.ClientTimeout(total=2)
        if self.cfg.metrics_path:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
                async with session.get(base + self.cfg.metrics_path, timeout=timeout) as resp:
                    if resp.status == 200:
                        stats.update(parse_server_metrics(await resp.text()))
        if self.cfg.slots_path:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                async with session.get(base + self.cfg.slots_path, timeout=timeout) as resp:
                    if resp.status == 200:
                        stats.update(parse_slots(await resp.json(content_type=None)))
        self.server_stats = stats

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
            await self.pidfile.reap(self.cfg.stop_grace_s, self._log)
        started = time.monotonic()
        self.kv_pool_bytes = kv_pool_bytes
        self._apply_limits(weights_bytes=weights_bytes, runtime_bytes=runtime_bytes)
        port = self.cfg.port or free_port(self.cfg.host)
        argv = template_argv(self.cfg.argv, self._values(port))
        if shutil.which(argv[0]) is None:
            raise BackendError(f"{self.service}: cannot start {argv[0]!r}: no such program")
        self._log(f"accelmux: starting {argv[0]} on port {port}; limit: {self.limit['summary']}")
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self._launch_argv(argv),
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
        self.pidfile.write(self._proc.pid)
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
        self.load_seconds = time.monotonic() - started
        self.resident_bytes = await asyncio.to_thread(self._measure_now)
        if self.resident_bytes is None:
            return LoadReport()
        # What it holds once up is weights + runtime + the KV pool it was started with.
        static = max(0, self.resident_bytes - kv_pool_bytes)
        weights = min(weights_bytes, static)
        return LoadReport(weights_bytes=weights, runtime_bytes=static - weights)

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

    async def unload(self, *, tier: Tier = Tier.COLD) -> None:
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
            self.pidfile.remove()
        if self.cgroup_path is not None:
            remove_service_cgroup(self.cgroup_path)
            self.cgroup_path = None
        self._proc = None
        self.resident_bytes = None
        self.server_stats = {}
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    @staticmethod
    def _signal(proc: asyncio.subprocess.Process, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)  # the child leads its own session and group

    @property
    def capabilities(self) -> Capabilities:
        return self.cfg.capabilities()

    async def pause(self, request_id: str, *, park: bool) -> None:
        raise BackendError(f"{self.service}: this backend does not declare pause")

    async def resume(self, request_id: str) -> None:
        raise BackendError(f"{self.service}: this backend does not declare pause")

    async def resize(self, kv_pool_bytes: int) -> None:
        # Declared next_load or none: the Manager sizes the pool at each start instead.
        raise BackendError(
            f"{self.service}: a running server's context cannot change; "
            "its KV pool is set at its next start"
        )

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
            "limit": self.limit,
            "measured": {
                "source": self.meter.source,
                "error": self.meter.error,
                "resident_bytes": self.resident_bytes,
                "load_seconds": (
                    round(self.load_seconds, 3) if self.load_seconds is not None else None
                ),
                "batch_size": self.batch_size,
            },
            "server": dict(self.server_stats),
        }

    async def close(self) -> None:
        await self._stop_process()
        self.peaks.close()
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
        token = self.peaks.begin()
        try:
            resp = await session.post(url, data=data, headers=headers)
        except (aiohttp.ClientError, OSError) as exc:
            self.peaks.end(token)
            raise BackendCrashedError(f"{self.service}: upstream unreachable: {exc}") from None
        except TimeoutError:
            self.peaks.end(token)
            raise BackendTimeoutError(f"{self.service}: upstream timed out") from None
        content_type = resp.headers.get("Content-Type", "application/json")
        if request.stream and resp.status == 200:
            response = BackendResponse(
                status=resp.status, content_type=content_type, release=resp.release
            )
            response.stream = self._relay(resp, token, response)
            return response
        try:
            body = await resp.read()
        except (aiohttp.ClientError, OSError) as exc:
            raise BackendCrashedError(f"{self.service}: upstream broke off: {exc}") from None
        except TimeoutError:
            raise BackendTimeoutError(f"{self.service}: upstream timed out") from None
        finally:
            resp.release()
            growth = self.peaks.end(token)
        peak = self._peak_bytes(growth, body[-USAGE_TAIL_BYTES:]) if resp.status == 200 else None
        return BackendResponse(
            status=resp.status, content_type=content_type, body=body, peak_bytes=peak
        )

    async def _relay(
        self, resp: aiohttp.ClientResponse, token: int, response: BackendResponse
    ) -> AsyncIterator[bytes]:
        tail = b""
        try:
            async for chunk in resp.content.iter_any():
                tail = (tail + chunk)[-USAGE_TAIL_BYTES:]
                yield chunk
        except (aiohttp.ClientError, OSError) as exc:
            raise BackendCrashedError(f"{self.service}: stream broke off: {exc}") from None
        finally:
            resp.release()
            growth = self.peaks.end(token)
        response.peak_bytes = self._peak_bytes(growth, tail)
