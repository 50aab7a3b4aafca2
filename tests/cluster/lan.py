"""Two (or more) "machines" on one host, for real: each its own network namespace (its
own address on a private LAN, its own loopback and ports), its own process table (a PID
namespace with its own ``/proc``: ``ps`` there shows that machine's processes only, as
Ray's tools expect), its own home and temporary directory. Each runs its own Ray node,
node agent and daemon exactly as a separate machine would.

The LAN is a bridge in the host's namespace (the host is one more machine on it, like a
laptop: the tests' clients run there) and one veth pair per machine. Real TCP crosses
it; nothing is emulated. A machine can be killed (its PID namespace's init ends, and the
kernel ends every process in it at once, as a power cut does), booted again (a fresh
process table, same disk and address), unplugged (its link down: packets vanish, as when
a machine hangs or its cable is pulled) and plugged back.

Creating namespaces needs root (``ip netns``, ``unshare``, ``nsenter``); where the
machine refuses, the tests that need it skip saying why.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import accelmux

SRC = Path(accelmux.__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


#: A machine's PID 1: it reaps whatever ends up its child (as an init does), and nothing
#: else.
INIT = (
    "import os, time\n"
    "while True:\n"
    "    try:\n"
    "        os.wait()\n"
    "    except ChildProcessError:\n"
    "        time.sleep(0.5)\n"
)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def namespaces_refused() -> str | None:
    """Why this machine cannot make network namespaces (None: it can)."""
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"needs the {tool} command for network and PID namespaces"
    if os.geteuid() != 0:
        return "needs root for network namespaces (ip netns add)"
    probe = f"amprobe{os.getpid() % 100000}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"this machine refuses network namespaces: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def need_namespaces() -> None:
    why = namespaces_refused()
    if why is not None:
        pytest.skip(why)


@dataclass
class Machine:
    """One machine of the LAN: a namespace, an address, a home."""

    name: str
    netns: str
    ip: str
    home: Path
    host_link: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    #: The machine's init (its PID namespace's process 1), as the host sees it.
    init: subprocess.Popen[bytes] | None = None

    def boot(self) -> None:
        """A fresh process table (the machine starting): an init in a new PID namespace,
        with its own /proc, inside the machine's network namespace."""
        if self.init is not None and self.init.poll() is None:
            return
        self.init = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                self.netns,
                "unshare",
                "--pid",
                "--fork",
                "--mount-proc",
                "--kill-child",
                sys.executable,
                "-c",
                INIT,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while self._init_pid() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"machine {self.name}: its init did not start")
            time.sleep(0.02)

    def _init_pid(self) -> int | None:
        """The pid (in the host's table) of the machine's process 1."""
        if self.init is None:
            return None
        try:
            children = Path(f"/proc/{self.init.pid}/task/{self.init.pid}/children").read_text()
        except OSError:
            return None
        pids = children.split()
        return int(pids[0]) if pids else None

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of a login on this machine: its own HOME and TMPDIR (Ray's
        files and token, accelmux's data), the project's virtualenv first on PATH."""
        out = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("RAY_", "PYTEST_", "ACCELMUX_CLUSTER"))
        }
        out.update(
            {
                "HOME": str(self.home),
                "TMPDIR": str(self.home / "tmp"),
                "PATH": os.pathsep.join([str(VENV_BIN), out.get("PATH", "/usr/bin:/bin")]),
                "PYTHONPATH": os.pathsep.join([str(SRC), *filter(None, [out.get("PYTHONPATH")])]),
                "RAY_USAGE_STATS_ENABLED": "0",
            }
        )
        out.update(extra or {})
        return out

    def argv(self, args: Sequence[str], cwd: Path | None = None) -> list[str]:
        """``args`` run on this machine, in ``cwd`` (its home by default)."""
        pid = self._init_pid()
        if pid is None:
            raise AssertionError(f"machine {self.name} is down")
        where = f"--wd={cwd or self.home}"
        return ["nsenter", "--target", str(pid), "--pid", "--mount", "--net", where, "--", *args]

    def run(
        self,
        args: Sequence[str],
        *,
        timeout: float = 120,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command on this machine and wait for it (a login shell's command)."""
        return subprocess.run(
            self.argv(args, cwd),
            env=self.env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def shell(self, script: str, **kw: object) -> subprocess.CompletedProcess[str]:
        return self.run(["bash", "-c", script], **kw)  # type: ignore[arg-type]

    def spawn(
        self,
        args: Sequence[str],
        *,
        log: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start a long-running command on this machine, its output to ``log``."""
        with log.open("ab") as out:
            proc = subprocess.Popen(
                self.argv(args, cwd),
                env=self.env(env),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        return proc

    @staticmethod
    def signal(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
        """Send ``sig`` to a command :meth:`spawn` started (nsenter forks it into the
        machine's PID namespace and does not pass signals on: its child gets them)."""
        try:
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        except OSError:
            children = []
        for pid in children or [str(proc.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), sig)

    def pids(self) -> list[int]:
        got = _ip("netns", "pids", self.netns, check=False)
        return [int(p) for p in got.stdout.split()]

    def kill(self, *, timeout: float = 10) -> None:
        """Every process of this machine ends at once (SIGKILL), as at a power cut."""
        pid = self._init_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # the kernel ends the whole PID namespace
        if self.init is not None:
            _reap(self.init, timeout)
            self.init = None
        deadline = time.monotonic() + timeout
        while True:
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise AssertionError(f"machine {self.name}: processes survive SIGKILL: {pids}")
            time.sleep(0.05)
        for proc in self.procs:
            _reap(proc, 5)
        self.procs.clear()

    def unplug(self) -> None:
        """Its link goes down: packets to and from it vanish, nothing is refused."""
        _ip("link", "set", self.host_link, "down")

    def plug(self) -> None:
        _ip("link", "set", self.host_link, "up")


def _reap(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait for ``proc`` (a host-side ``ip netns exec`` or ``nsenter`` whose machine was
    just killed); one still running after ``timeout`` (a slow machine: its child took
    longer to die) is killed itself and waited for, never dropped while it runs (a
    running ``Popen`` that is garbage-collected is a ``ResourceWarning``, which the test
    that happens to be running then fails on)."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass
class Lan:
    bridge: str
    gateway_ip: str
    machines: dict[str, Machine]
    root: Path

    def __getitem__(self, name: str) -> Machine:
        return self.machines[name]


def _subnet() -> tuple[str, str]:
    """A /24 of 10.0.0.0/8 and a tag, both derived from this process: two test runs on
    one host never share a bridge or a subnet."""
    pid = os.getpid()
    return f"10.{100 + pid % 150}.{(pid // 150) % 250}", f"{pid % 100000}"


@contextlib.contextmanager
def lan(names: Sequence[str]) -> Iterator[Lan]:
    """Machines ``names`` on one LAN, each with an address ``.1``, ``.2``... of a private
    /24 (the host is ``.254``); everything is torn down at the end, whatever happened."""
    need_namespaces()
    net, tag = _subnet()
    bridge = f"amb{tag}"
    root = Path(tempfile.mkdtemp(prefix=f"am{tag}-", dir="/tmp"))  # short: Ray's sockets
    made: list[str] = []
    machines: dict[str, Machine] = {}
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{net}.254/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, name in enumerate(names, start=1):
            netns = f"am{tag}{name}"[:15]
            host_link = f"am{tag}h{i}"[:15]
            _ip("netns", "add", netns)
            made.append(netns)
            _ip("link", "add", host_link, "type", "veth", "peer", "name", f"am{tag}p{i}")
            _ip("link", "set", f"am{tag}p{i}", "netns", netns)
            _ip("link", "set", host_link, "master", bridge)
            _ip("link", "set", host_link, "up")
            inside = ["netns", "exec", netns, "ip"]
            _ip(*inside, "link", "set", f"am{tag}p{i}", "name", "eth0")
            _ip(*inside, "addr", "add", f"{net}.{i}/24", "dev", "eth0")
            _ip(*inside, "link", "set", "eth0", "up")
            _ip(*inside, "link", "set", "lo", "up")
            _ip(*inside, "route", "add", "default", "via", f"{net}.254")
            home = root / name
            (home / "tmp").mkdir(parents=True)
            machine = Machine(name, netns, f"{net}.{i}", home, host_link)
            machines[name] = machine
            machine.boot()
        yield Lan(bridge, f"{net}.254", machines, root)
    finally:
        for machine in machines.values():
            with contextlib.suppress(Exception):
                machine.kill()
        for netns in made:
            _ip("netns", "del", netns, check=False)
        _ip("link", "del", bridge, check=False)
        shutil.rmtree(root, ignore_errors=True)
