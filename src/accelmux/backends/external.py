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

``sleep: vllm`` (:mod:`accelmux.backends.vllm_sleep`): an unload to tier ``sleeping``
asks vLLM to sleep (the process stays, its device memory drops) and the next load wakes
it; a server that refuses or does not answer within ``sleep_timeout_s`` is stopped
instead (a cold unload, or a cold start for the load), with a log line saying why, and a
load whose sizes differ from the sleeping server's starts it again. Its exit while asleep
is a crash, reported as any other. ``park: llama-server``
(:mod:`accelmux.backends.slot_park`): streamed completions are served so that they can be
paused between tokens and parked with llama-server's slot save and restore.

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
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

from accelmux.backends import child_launch, vllm_sleep
from accelmux.backends.base import BackendRequest, BackendResponse, CrashCallback, LoadReport
from accelmux.backends.leftovers import PidFile
from accelmux.backends.limits import (
    MPS_LIMIT_ENV,
    CgroupSupport,
    apply_limits,
    gpu_memory_fraction,
    limit_bytes,
    mps_in_use,
    mps_limit_value,
    remove_service_cgroup,
)
from accelmux.backends.pausable import why_not_pausable
from accelmux.backends.process_meter import PeakTracker, ProcessTreeMeter
from accelmux.backends.server_log import ServerLog
from accelmux.backends.server_metrics import (
    argv_option,
    parse_server_metrics,
    parse_slots,
    reported_batch_size,
)
from accelmux.backends.slot_park import SlotParking, slot_dir
from accelmux.backends.upstream import UpstreamError, UpstreamPool
from accelmux.config.backends import ExternalBackendConfig
from accelmux.core.specs import Capabilities
from accelmux.core.types import Tier
from accelmux.errors import BackendCrashedError, BackendError, BackendTimeoutError

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
        self.output = ServerLog(
            (data_dir / "logs" / f"{service}.log") if data_dir else None, cfg.log_lines
        )
        self.pidfile = PidFile((data_dir / "run" / f"{service}.pid") if data_dir else None)
        self.port: int | None = None
        self.kv_pool_bytes = 0
        self.starts = 0
        self.last_exit: int | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self._upstream: UpstreamPool | None = None
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
        #: llama-server's ``-b``: its logical batch in tokens (a flag, not what runs)
        self.batch_tokens_flag = argv_option(cfg.argv, "-b", "--batch-size")
        self.sleeping = False
        self.sleep_stats: dict[str, Any] = {"sleeps": 0, "wakes": 0, "refused": 0}
        self._argv: list[str] = []  # what the running process was started with
        self.slot_dir = slot_dir(data_dir, service)
        self.parking: SlotParking | None = None
        if cfg.park == "llama-server":
            self.parking = SlotParking(
                service,
                self.slot_dir,
                base_url=self._base_url,
                session=self._session_get,
                peaks=self.peaks,
                kv_bytes_per_token=kv_bytes_per_token,
                log=self.output.write,
            )

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
            "ctx_total": max(1, ctx),
            "ctx_per_slot": max(1, ctx // max(1, self.concurrency)),
            "parallel": self.concurrency,
            "kv_pool_bytes": self.kv_pool_bytes,
            "model": self.model,
            "gpu": self.gpu_index if self.gpu_index is not None else "",
            "memory_limit_bytes": self.limit_bytes,
            "gpu_memory_utilization": gpu_memory_fraction(self.limit_bytes, self.device_capacity),
            "slot_save_path": str(self.slot_dir),
        }

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.gpu_index is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(self.gpu_index)
        if self.cfg.sleep == "vllm":
            env[vllm_sleep.DEV_MODE_ENV] = "1"
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
        self.cgroup_path, self.limit = apply_limits(
            self.service,
            self.limit_bytes,
            argv=self.cfg.argv,
            env=self._env_base(),
            on_gpu=self.gpu_index is not None,
            enabled=self.cfg.memory_limit,
            cgroup=self.cgroup_support,
        )

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

    def _base_url(self) -> str:
        return f"http://{self.cfg.host}:{self.port}"

    async def load(
        self, *, weights_bytes: int, runtime_bytes: int, kv_pool_bytes: int
    ) -> LoadReport:
        if self.sleeping:
            woken = await self._wake(weights_bytes, runtime_bytes, kv_pool_bytes)
            if woken is not None:
                return woken
        await self._stop_process()
        self.output.open()
        if self.starts == 0:
            await self.pidfile.reap(self.cfg.stop_grace_s, self.output.write)
        started = time.monotonic()
        self.kv_pool_bytes = kv_pool_bytes
        self._apply_limits(weights_bytes=weights_bytes, runtime_bytes=runtime_bytes)
        port = self.cfg.port or free_port(self.cfg.host)
        argv = template_argv(self.cfg.argv, self._values(port))
        if shutil.which(argv[0]) is None:
            raise BackendError(f"{self.service}: cannot start {argv[0]!r}: no such program")
        if self.parking is not None:
            self.parking.prepare(first=self.starts == 0)
        self.output.write(
            f"accelmux: starting {argv[0]} on port {port}; limit: {self.limit['summary']}"
        )
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
        self._argv = argv
        self._urls = {}
        self.starts += 1
        self.pidfile.write(self._proc.pid)
        self._stopping = False
        proc = self._proc
        self._tasks = [asyncio.create_task(self.output.read_from(proc))]
        try:
            await self._wait_healthy(proc)
        except BaseException:
            await self._stop_process()
            raise
        self._loaded = True
        self._tasks.append(asyncio.create_task(self._watch(proc)))
        if self.parking is not None:
            await self.parking.learn_slots()
        self.load_seconds = time.monotonic() - started
        return await self._report(weights_bytes, kv_pool_bytes)

    async def _report(self, weights_bytes: int, kv_pool_bytes: int) -> LoadReport:
        self.resident_bytes = await asyncio.to_thread(self._measure_now)
        self.peaks.seed(self.resident_bytes)
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
                    f"{self.output.tail()}"
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
                    f"{self.output.tail()}"
                )
            await asyncio.sleep(delay)
            delay = min(0.5, delay * 1.5)

    async def _watch(self, proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        self.last_exit = code
        if self._stopping or proc is not self._proc:
            return
        self._loaded = False
        asleep, self.sleeping = self.sleeping, False
        how = " while asleep" if asleep else ""
        self.output.write(f"accelmux: process exited with code {code}{how}")
        if self._on_crash is not None:
            self._on_crash(
                f"{self.service}: process exited with code {code}{how}{self.output.tail()}"
            )

    async def unload(self, *, tier: Tier = Tier.COLD) -> None:
        sleeps = tier is Tier.SLEEPING and self.cfg.sleep == "vllm"
        if sleeps and (self.sleeping or (self._loaded and await self._sleep())):
            return
        await self._stop_process()
        self._loaded = False

    # ---- vLLM's sleep mode --------------------------------------------------------------
    async def _sleep(self) -> bool:
        """Ask the server to sleep; False (logged) when it did not."""
        started = time.monotonic()
        why = await vllm_sleep.sleep(
            self._session_get(), self._base_url(), self.cfg.sleep_timeout_s
        )
        if why is not None:
            self._sleep_problem(f"sleep refused ({why}); stopping the server instead")
            return False
        self._loaded, self.sleeping, self.server_stats = False, True, {}
        self.sleep_stats["sleeps"] += 1
        self.sleep_stats["last_sleep_s"] = round(time.monotonic() - started, 3)
        self.resident_bytes = await asyncio.to_thread(self._measure_now)
        self.output.write(f"accelmux: asleep; the process holds {self.resident_bytes} bytes")
        return True

    async def _wake(
        self, weights_bytes: int, runtime_bytes: int, kv_pool_bytes: int
    ) -> LoadReport | None:
        """Wake the sleeping server; None when it has to start again instead: the load
        asks for other sizes than it runs with (a woken server keeps them), or the wake
        failed."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return None
        enforced = self.limit_bytes  # what its cgroup (if any) was made with
        self.kv_pool_bytes = kv_pool_bytes
        self.limit_bytes = limit_bytes(
            weights=weights_bytes,
            runtime=runtime_bytes,
            kv_pool=kv_pool_bytes,
            workspace=self.workspace_bytes,
            concurrency=self.concurrency,
            margin=self.cfg.limit_margin,
        )
        if template_argv(self.cfg.argv, self._values(self.port or 0)) != self._argv:
            self.output.write(
                "accelmux: this load's sizes differ from the sleeping server's; restarting it"
            )
            return None
        self.limit_bytes = enforced
        started = time.monotonic()
        try:
            session, base = self._session_get(), self._base_url()
            why = await vllm_sleep.wake_up(session, base, self.cfg.sleep_timeout_s)
            if why is None:
                await self._wait_healthy(proc)
        except BaseException:
            await self._stop_process()
            raise
        if why is not None:
            self._sleep_problem(f"wake refused ({why}); starting the server again")
            return None
        self._loaded, self.sleeping = True, False
        self.load_seconds = time.monotonic() - started
        self.sleep_stats["wakes"] += 1
        self.sleep_stats["last_wake_s"] = round(self.load_seconds, 3)
        return await self._report(weights_bytes, kv_pool_bytes)

    def _sleep_problem(self, what: str) -> None:
        self.sleep_stats["refused"] += 1
        self.sleep_stats["last_problem"] = what
        self.output.write(f"accelmux: {what}")

    async def _stop_process(self) -> None:
        proc = self._proc
        self._stopping = True
        if proc is not None:
            if proc.returncode is None:
                self._signal(proc, signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), self.cfg.stop_grace_s)
                except TimeoutError:
                    self.output.write("accelmux: no exit after SIGTERM, sending SIGKILL")
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
        self._argv = []
        self.sleeping = False
        self.resident_bytes = None
        self.server_stats = {}
        self.output.close()

    @staticmethod
    def _signal(proc: asyncio.subprocess.Process, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)  # the child leads its own session and group

    @property
    def capabilities(self) -> Capabilities:
        return self.cfg.capabilities()

    def can_pause(self, request: BackendRequest) -> bool:
        """Whether ``request`` could be paused here (``park: llama-server`` and a request
        the pausable path reproduces: no tools, response format, log probabilities, n>1)."""
        return self.parking is not None and why_not_pausable(request) is None

    async def pause(self, request_id: str, *, park: bool) -> None:
        if self.parking is None:
            raise BackendError(f"{self.service}: this backend does not declare pause")
        await self.parking.pause(request_id, park=park)

    async def resume(self, request_id: str) -> None:
        if self.parking is None:
            raise BackendError(f"{self.service}: this backend does not declare pause")
        await self.parking.resume(request_id)

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
            "log_file": str(self.output.path) if self.output.path else None,
            "log_tail": list(self.output.lines)[-10:],
            "limit": self.limit,
            "measured": {
                "source": self.meter.source,
                "error": self.meter.error,
                "resident_bytes": self.resident_bytes,
                "load_seconds": (
                    round(self.load_seconds, 3) if self.load_seconds is not None else None
                ),
                "batch_size": reported_batch_size(self.server_stats),
                "batch_tokens_flag": self.batch_tokens_flag,
            },
            "server": dict(self.server_stats),
            "sleep": {"sleeping": self.sleeping, **self.sleep_stats} if self.cfg.sleep else None,
            "park": self.parking.describe() if self.parking is not None else None,
        }

    async def close(self) -> None:
        await self._stop_process()
        if self._upstream is not None:
            self._upstream.close()
            self._upstream = None
        if self.parking is not None:
            self.parking.close()
        self.peaks.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

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
        if self.parking is not None and self.parking.handles(request):
            return await self.parking.start(request)
        data, headers = self._payload(request)
        if request.stream:
            # llama-server closes a stream's connection right after it (though it says
            # keep-alive): one reused at that moment fails the next request.
            headers["Connection"] = "close"
        if isinstance(data, bytes):
            return await self._pooled(request, data, headers)
        session = self._session_get()
        token = self.peaks.begin()
        try:
            resp = await session.post(url, data=data, headers=headers)
        except (aiohttp.ClientError, OSError) as exc:
            self._ended(request, token)
            raise BackendCrashedError(f"{self.service}: upstream unreachable: {exc}") from None
        except TimeoutError:
            self._ended(request, token)
            raise BackendTimeoutError(f"{self.service}: upstream timed out") from None
        content_type = resp.headers.get("Content-Type", "application/json")
        if request.stream and resp.status == 200:
            response = BackendResponse(
                status=resp.status, content_type=content_type, release=resp.release
            )
            response.stream = self._relay(
                resp.content.iter_any(), resp.release, request, token, response
            )
            return response
        try:
            body = await resp.read()
        except (aiohttp.ClientError, OSError) as exc:
            raise BackendCrashedError(f"{self.service}: upstream broke off: {exc}") from None
        except TimeoutError:
            raise BackendTimeoutError(f"{self.service}: upstream timed out") from None
        finally:
            resp.release()
            growth = self._ended(request, token)
        peak = self._peak_bytes(growth, body[-USAGE_TAIL_BYTES:]) if resp.status == 200 else None
        return BackendResponse(
            status=resp.status, content_type=content_type, body=body, peak_bytes=peak
        )

    def _pool(self) -> UpstreamPool:
        """The keep-alive connections to the server's current port."""
        assert self.port is not None
        pool = self._upstream
        if pool is None or pool.port != self.port:
            if pool is not None:
                pool.close()
            pool = self._upstream = UpstreamPool(self.cfg.host, self.port)
        return pool

    async def _pooled(
        self, request: BackendRequest, data: bytes, headers: dict[str, str]
    ) -> BackendResponse:
        """A JSON request over the pooled keep-alive client (backends/upstream.py): the
        body's bytes as they are, the answer read whole or relayed as it comes."""
        token = self.peaks.begin()
        timeout = self.cfg.request_timeout_s
        try:
            async with asyncio.timeout(timeout):
                answer = await self._pool().post(
                    request.endpoint, data, headers, stream=request.stream
                )
        except (UpstreamError, OSError) as exc:
            self._ended(request, token)
            raise BackendCrashedError(f"{self.service}: upstream unreachable: {exc}") from None
        except TimeoutError:
            self._ended(request, token)
            raise BackendTimeoutError(f"{self.service}: upstream timed out") from None
        if request.stream and answer.status == 200:
            response = BackendResponse(
                status=answer.status, content_type=answer.content_type, release=answer.release
            )
            response.stream = self._relay(answer.chunks(), answer.release, request, token, response)
            return response
        growth = self._ended(request, token)
        body = answer.body
        if request.stream:  # an error instead of a stream: read whole
            try:
                async with asyncio.timeout(timeout):
                    body = b"".join([chunk async for chunk in answer.chunks()])
            except (UpstreamError, OSError) as exc:
                raise BackendCrashedError(f"{self.service}: upstream broke off: {exc}") from None
        peak = self._peak_bytes(growth, body[-USAGE_TAIL_BYTES:]) if answer.status == 200 else None
        return BackendResponse(
            status=answer.status, content_type=answer.content_type, body=body, peak_bytes=peak
        )

    def _ended(self, request: BackendRequest, token: int) -> int:
        if self.parking is not None:
            self.parking.unpausable_ended(request.request_id)
        return self.peaks.end(token)

    async def _relay(
        self,
        chunks: AsyncIterator[bytes],
        release: Callable[[], None],
        request: BackendRequest,
        token: int,
        response: BackendResponse,
    ) -> AsyncIterator[bytes]:
        """A streamed answer's bytes as they come (from aiohttp's client or the pooled
        one), its end accounted and its usage read from its tail."""
        tail = b""
        try:
            async for chunk in chunks:
                tail = (tail + chunk)[-USAGE_TAIL_BYTES:]
                yield chunk
        except (aiohttp.ClientError, UpstreamError, OSError) as exc:
            raise BackendCrashedError(f"{self.service}: stream broke off: {exc}") from None
        finally:
            release()
            growth = self._ended(request, token)
        response.peak_bytes = self._peak_bytes(growth, tail)
