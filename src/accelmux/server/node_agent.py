"""``accelmux node``: a machine's node agent, in the foreground (or under its unit).

The agent keeps two processes running (:class:`accelmux.cluster.child.Kept`), each
started again when it ends:

* the node's **daemon** (:mod:`.node_daemon`): the machine's ordinary daemon with the
  services this node may host, on 127.0.0.1 and on the LAN address at
  ``cluster.node_port`` (the gateways' direct path, guarded by the cluster's key);
* the node's **link to Ray** (:mod:`accelmux.cluster.registry`): it registers the node in
  the Ray cluster once the daemon answers, and joins again whenever Ray comes back.

Neither depends on the other: the daemon serves whatever happens to Ray (a lost head, a
restarted Ray node), and the link's output (Ray's) goes to a log file. The terminal gets
one line per event. A refused token is the one problem a retry cannot fix: the agent
stops, saying so. The agent itself is started again by its unit (``Restart=always``).

Its files (logs, its pid) are in ``server.data_dir/node-NAME``; ``accelmux node --stop``
ends it there (the daemon drains its requests in flight first).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from accelmux.cluster.registry import FATAL
from accelmux.errors import ClusterError
from accelmux.server.kept import Kept

#: How long a freshly started daemon may take to answer before it is reported stuck.
READY_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class AgentPlan:
    """What one node agent runs, from the command line and the config."""

    node: str
    config: Path
    cluster: str
    address: str
    port: int
    data_dir: Path

    def daemon_argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "accelmux.server.node_daemon",
            "--node",
            self.node,
            "-c",
            str(self.config),
            "--address",
            self.address,
        ]

    def link_argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "accelmux.cluster.registry",
            "node",
            "--cluster",
            self.cluster,
            "--node",
            self.node,
            "--address",
            self.address,
            "--port",
            str(self.port),
        ]


def say(line: str) -> None:
    print(line, flush=True)


def pid_file(data_dir: Path) -> Path:
    return data_dir / "agent.pid"


def running_agent(data_dir: Path) -> int | None:
    """The pid of the agent running for this node on this machine (None: none)."""
    try:
        pid = int(pid_file(data_dir).read_text(encoding="ascii").strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"accelmux" in cmdline and b"node" in cmdline else None


class NodeAgent:
    def __init__(self, plan: AgentPlan) -> None:
        self.plan = plan
        self.stop = asyncio.Event()
        self.fatal: str | None = None
        self._registered = False
        self._link_trouble: str | None = None
        self._daemon_up = False
        #: The daemon has answered at least once since the agent started.
        self._served = False
        self._services = ""
        logs = plan.data_dir
        self.daemon = Kept(
            "daemon",
            plan.daemon_argv(),
            log_path=logs / "daemon.log",
            on_exit=self._daemon_exited,
            reports=False,
        )
        self.link = Kept(
            "ray link",
            plan.link_argv(),
            log_path=logs / "ray-link.log",
            on_report=self._link_report,
            on_exit=self._link_exited,
            max_backoff_s=5.0,
        )

    # ---- what the terminal is told -------------------------------------------------------
    def _daemon_exited(self, code: int, ran: float) -> None:
        was_up = self._daemon_up
        self._daemon_up = False
        how = f"signal {-code}" if code < 0 else f"status {code}"
        if not self._served and code > 0:
            # It never answered: its config, its port taken... starting again will not help.
            tail = _last_line(self.plan.data_dir / "daemon.log")
            self._give_up(f"the daemon cannot start: {tail}")
            return
        if was_up or code != 0:
            say(f"node {self.plan.node}: the daemon ended ({how}); starting it again")

    def _link_report(self, report: dict[str, Any]) -> None:
        event = report.get("event")
        if event == "registered":
            node_id = str(report.get("ray_node_id", ""))[:12]
            again = " again" if self._link_trouble is not None else ""
            self._link_trouble = None
            self._registered = True
            say(
                f"node {self.plan.node}: registered{again} in the Ray cluster at "
                f"{self.plan.cluster} (Ray node {node_id})"
            )
        elif event == "error":
            message = str(report.get("message", "the Ray link failed"))
            if report.get("fatal"):
                self._give_up(message)
            elif self._link_trouble != message:
                self._link_trouble = message
                if self._registered:
                    message += "; the daemon keeps serving"
                say(f"node {self.plan.node}: {message}; joining again")
            self._registered = False

    def _link_exited(self, code: int, ran: float) -> None:
        if code == FATAL and self.fatal is None:
            self._give_up("the Ray link stopped (see ray-link.log)")
        elif self._registered:
            self._registered = False
            self._link_trouble = "the Ray link ended"
            say(
                f"node {self.plan.node}: lost the Ray cluster; the daemon keeps serving; "
                "joining again"
            )

    def _give_up(self, why: str) -> None:
        if self.fatal is None:
            self.fatal = why
        self.stop.set()

    # ---- running ---------------------------------------------------------------------
    async def run(self) -> int:
        tasks = [asyncio.create_task(self.daemon.run()), asyncio.create_task(self._watch())]
        try:
            await self.stop.wait()
        finally:
            await self.link.stop()
            await self.daemon.stop(timeout_s=60)
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.fatal is not None:
            raise ClusterError(f"node {self.plan.node}: {self.fatal}")
        say(f"node {self.plan.node}: stopped")
        return 0

    async def _watch(self) -> None:
        """Tell when the daemon answers (after each start); register once it first does."""
        link: asyncio.Task[None] | None = None
        seen = 0
        base = f"http://127.0.0.1:{self.plan.port}"
        async with aiohttp.ClientSession() as session:
            try:
                while True:
                    fresh = self.daemon.starts != seen and not self._daemon_up
                    if fresh and await self._ready(session, base):
                        seen = self.daemon.starts
                        self._daemon_up = True
                        self._served = True
                        say(self._serving_line(seen > 1))
                        if link is None:
                            link = asyncio.create_task(self.link.run())
                    await asyncio.sleep(0.1)
            finally:
                if link is not None:
                    link.cancel()

    async def _ready(self, session: aiohttp.ClientSession, base: str) -> bool:
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError):
            timeout = aiohttp.ClientTimeout(total=2)
            async with session.get(base + "/cluster/snapshot", timeout=timeout) as resp:
                if resp.status == 200:
                    snap = await resp.json()
                    names = [s["service"] for s in snap.get("services", [])]
                    self._services = ", ".join(names) or "none"
                    return True
        return False

    def _serving_line(self, again: bool) -> str:
        p = self.plan
        if again:
            return f"node {p.node}: the daemon serves again"
        return (
            f"node {p.node}: daemon on {p.address}:{p.port} for the gateways and "
            f"127.0.0.1:{p.port} on this machine (services: {self._services}); "
            f"logs in {p.data_dir}"
        )


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return "see its log"
    return lines[-1] if lines else "see its log"


def run_agent(plan: AgentPlan) -> int:
    """Run node ``plan.node``'s agent until SIGTERM/SIGINT (or a problem a retry cannot
    fix, raised as :class:`ClusterError`)."""
    plan.data_dir.mkdir(parents=True, exist_ok=True)
    other = running_agent(plan.data_dir)
    if other is not None and other != os.getpid():
        raise ClusterError(
            f"node {plan.node!r} already runs on this machine (pid {other}); stop it first: "
            f"accelmux node --stop --node {plan.node} -c {plan.config}"
        )
    pid_file(plan.data_dir).write_text(f"{os.getpid()}\n", encoding="ascii")

    async def main() -> int:
        agent = NodeAgent(plan)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, agent.stop.set)
        return await agent.run()

    try:
        return asyncio.run(main())
    finally:
        with contextlib.suppress(OSError):
            if running_agent(plan.data_dir) in (None, os.getpid()):
                pid_file(plan.data_dir).unlink()


def stop_agent(data_dir: Path, timeout_s: float, wait: Callable[[float], None]) -> bool:
    """End the agent running for this node on this machine (SIGTERM: its daemon drains
    first); False when none runs."""
    pid = running_agent(data_dir)
    if pid is None:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    waited = 0.0
    while waited < timeout_s and running_agent(data_dir) == pid:
        wait(0.1)
        waited += 0.1
    return True
