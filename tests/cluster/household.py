"""A household's cluster on two machines (:mod:`.lan`), brought up by docs/cluster.md's
own commands: the steps of "Starting it on two machines" as typed in terminals, and
"Starting at boot": the units ``accelmux service install --node`` writes, run as
systemd runs them.

The page's commands are read from the page itself, so the tests follow what a user
reads: each ```bash block of the steps (``# on MACHINE`` says where the lines after it
run; ``export`` sets that terminal's environment; ``scp FILE MACHINE:PATH`` copies; the
long-running ``accelmux node`` and ``accelmux serve`` stay in the foreground, as in a
terminal; ``sudo`` is dropped: the tests run as root). Only the page's example
addresses and install path are replaced by the test machines' own, and each machine's
/etc/accelmux and /var/lib/accelmux are a tree of its own (:meth:`Household.sysroot`).

systemd does not run in the test machines: ``accelmux service install`` writes its
files under the machine's tree (``--root``) and :class:`Unit` does what systemd does with
each unit written (its ``ExecStart`` with its ``Environment``, in its
``WorkingDirectory``, started again ``RestartSec`` after it ends, until the machine goes
down).
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from tests import waiting
from tests.cluster.lan import VENV_BIN, Lan, Machine, lan
from tests.cluster.support import need_ray

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "cluster.md"
EXAMPLE = ROOT / "examples" / "cluster-fake.yaml"
#: The page's example machines and their addresses.
MACHINES = {"gpu-box": "192.168.1.10", "mini": "192.168.1.11"}
API_KEY = "change-this-household-key"
ADMIN_KEY = "change-this-admin-key"
LONG_RUNNING = ("accelmux node", "accelmux serve")
STEPS = "Starting it on two machines"
BOOT = "Starting at boot: units"
INSTALL = "accelmux service install"


def wait_until(what: str, check: Callable[[], bool], timeout: float = 30.0) -> float:
    """Seconds it took until ``check()`` held (:func:`tests.waiting.wait_until`, which
    fails after ``timeout``)."""
    started = time.monotonic()
    waiting.wait_until(check, timeout=timeout, message=what)
    return time.monotonic() - started


# ---- the page -------------------------------------------------------------------------


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def doc_lines(section: str, text: str | None = None) -> list[tuple[str, str]]:
    """(machine, command) of every line of the bash blocks of ``section``, in order."""
    body = _section(text or DOC.read_text(encoding="utf-8"), section)
    out: list[tuple[str, str]] = []
    for block in re.findall(r"```bash\n(.*?)```", body, re.S):
        machine = None
        for raw in block.replace("\\\n", " ").splitlines():
            line = raw.strip()
            where = re.fullmatch(r"# on ([\w-]+)", line)
            if where:
                machine = where.group(1)
            elif line and not line.startswith("#"):
                assert machine is not None, f"docs/cluster.md: no '# on MACHINE' before {line!r}"
                out.append((machine, " ".join(line.split())))
    return out


def doc_steps(text: str | None = None) -> list[tuple[str, str]]:
    """The commands of "Starting it on two machines"."""
    return doc_lines(STEPS, text)


@dataclass(frozen=True)
class UnitFile:
    name: str
    machine: str
    exec_start: str
    environment: dict[str, str]
    restart_s: float
    always: bool
    workdir: str | None
    user: str | None


def read_unit(path: Path, machine: str) -> UnitFile:
    """What systemd takes from a unit file to run it (the lines ``accelmux service
    install`` writes: one setting a line, ``Environment=`` one assignment each)."""
    fields: dict[str, list[str]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith(("#", "[")):
            fields.setdefault(key.strip(), []).append(value.strip())
    env = dict(shlex.split(e)[0].split("=", 1) for e in fields.get("Environment", []))
    return UnitFile(
        name=path.name,
        machine=machine,
        exec_start=fields["ExecStart"][0],
        environment=env,
        restart_s=float(fields.get("RestartSec", ["0.1"])[0]),
        always=fields.get("Restart", ["no"])[0] == "always",
        workdir=fields.get("WorkingDirectory", [None])[0],
        user=fields.get("User", [None])[0],
    )


# ---- the household ------------------------------------------------------------------


@dataclass
class Terminal:
    """A long-running command typed in a terminal on one machine."""

    machine: str
    command: str
    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")


class Unit:
    """One unit file run as systemd would: ``ExecStart`` with its ``Environment`` in its
    ``WorkingDirectory`` (with ``User=``, HOME is that directory, the service user's
    home), started again ``RestartSec`` after it ends (``Restart=always``; after a
    failure only, otherwise), until :meth:`stop` or until its machine goes down. It runs
    as root: the test machines have no service user."""

    def __init__(self, house: Household, unit: UnitFile) -> None:
        self.house = house
        self.unit = unit
        self.machine = house.lan[unit.machine]
        self.log = house.lan.root / f"{unit.machine}-{unit.name}.log"
        self.starts = 0
        #: the machine's boot this unit belongs to: after a reboot, the units start anew
        self.boot = self.machine.init
        self.proc: subprocess.Popen[bytes] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=unit.name, daemon=True)

    def start(self) -> Unit:
        self._thread.start()
        return self

    def _run(self) -> None:
        local = functools.partial(self.house.local, self.unit.machine)
        argv = shlex.split(local(self.unit.exec_start))
        env = {key: local(value) for key, value in self.unit.environment.items()}
        cwd = Path(local(self.unit.workdir)) if self.unit.workdir else None
        if self.unit.user is not None and cwd is not None:
            env["HOME"] = str(cwd)  # the service user's home: its state directory
        while not self._stop.is_set() and self.machine.init is self.boot:
            try:
                self.proc = self.machine.spawn(argv, log=self.log, env=env, cwd=cwd)
            except AssertionError:  # the machine is down: so is its unit
                return
            self.starts += 1
            while self.proc.poll() is None and not self._stop.is_set():
                time.sleep(0.1)
            if self.proc.returncode == 0 and not self.unit.always:
                return  # Restart=on-failure: a clean exit stays down
            self._stop.wait(self.unit.restart_s)

    def stop(self) -> None:
        """``systemctl stop``: SIGTERM, and it is not started again."""
        self._stop.set()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            Machine.signal(proc, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=60)
        self._thread.join(timeout=5)


@dataclass
class Household:
    lan: Lan
    terminals: list[Terminal] = field(default_factory=list)
    units: list[Unit] = field(default_factory=list)
    envs: dict[str, dict[str, str]] = field(default_factory=dict)
    outputs: list[tuple[str, str, str]] = field(default_factory=list)

    # ---- the page's names, on the test machines --------------------------------------
    def ip(self, name: str) -> str:
        return self.lan[name].ip

    def sysroot(self, machine: str) -> Path:
        """Where the machine's system files live (/etc, /var/lib): the machines share
        the host's file system, so each has its own tree for them."""
        return self.lan[machine].home / "sysroot"

    def local(self, machine: str, text: str) -> str:
        """``text`` with the page's addresses and paths made the test machines'."""
        for name, address in MACHINES.items():
            text = text.replace(address, self.ip(name))
        root = str(self.sysroot(machine))
        text = text.replace("/opt/accelmux/bin/", f"{VENV_BIN}/")
        text = text.replace(" ~/", f" {self.lan[machine].home}/")
        # a path of the page's, not one already made the machine's (the units hold both)
        return re.sub(r"(?<![\w/.-])(/etc/accelmux|/var/lib/accelmux)", root + r"\1", text)

    def write_config(self, data: dict[str, Any] | None = None) -> None:
        """The cluster's config, the same on every machine, as ``~/cluster.yaml``."""
        text = EXAMPLE.read_text(encoding="utf-8") if data is None else yaml.safe_dump(data)
        for name, machine in self.lan.machines.items():
            (machine.home / "cluster.yaml").write_text(self.local(name, text), encoding="utf-8")

    # ---- typing the steps ---------------------------------------------------------------
    def type_command(self, machine: str, command: str, *, ready: str | None = None) -> None:
        """Run one line of the page on ``machine`` as a terminal would."""
        env = self.envs.setdefault(machine, {})
        command = self.local(machine, command.removeprefix("sudo "))
        if f"{INSTALL} " in command:  # no systemd here: the files, then as systemd would
            command += f" --root {self.sysroot(machine)}"
        m = self.lan[machine]
        if command.startswith("export "):
            key, _, value = command.removeprefix("export ").partition("=")
            env[key] = value
        elif command.startswith("scp "):
            _, src, dest = command.split()
            other, _, path = dest.partition(":")
            target = self.lan[other].home / path
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(m.home / src.removeprefix("~/"), target)
            target.chmod(0o600)
        elif command.startswith(LONG_RUNNING):
            log = self.lan.root / f"{machine}-terminal-{len(self.terminals)}.log"
            proc = m.spawn(shlex.split(command), log=log, env=dict(env))
            term = Terminal(machine, command, proc, log)
            self.terminals.append(term)
            if ready is not None:
                wait_until(
                    f"{command!r} on {machine} to say {ready!r}",
                    lambda: ready in term.output() or proc.poll() is not None,
                    timeout=120,
                )
                assert proc.poll() is None, f"{command!r} on {machine} ended:\n{term.output()}"
        else:
            done = m.run(shlex.split(command), env=dict(env), timeout=180)
            self.outputs.append((machine, command, done.stdout + done.stderr))
            assert done.returncode == 0, f"{command!r} on {machine} failed:\n{done.stderr}"

    def follow_the_steps(self) -> None:
        """Every step of docs/cluster.md, in order; each agent's registration and the
        gateway's first line are awaited, as a user watches their terminals."""
        for machine, command in doc_steps():
            ready = None
            if command.startswith("accelmux node"):
                ready = "registered in the Ray cluster"
            elif command.startswith("accelmux serve"):
                ready = "gateway listening on"
            self.type_command(machine, command, ready=ready)

    def switch_to_units(self, machine: str) -> list[Unit]:
        """The page's "Starting at boot" on ``machine``: Ctrl-C in its terminals, then
        its commands (``ray stop``, the config in /etc, ``accelmux service install``);
        then its units start, as the install starts them."""
        for term in self.terminals:
            if term.machine == machine and term.proc.poll() is None:
                Machine.signal(term.proc, signal.SIGINT)
                term.proc.wait(timeout=60)
        for where, command in doc_lines(BOOT):
            if where == machine:
                self.type_command(machine, command)
        return self.start_units(machine)

    def installed_units(self, machine: str) -> list[UnitFile]:
        """The units ``accelmux service install`` wrote on ``machine``."""
        units = self.sysroot(machine) / "etc" / "systemd" / "system"
        return [read_unit(path, machine) for path in sorted(units.glob("*.service"))]

    def start_units(self, machine: str, names: tuple[str, ...] = ()) -> list[Unit]:
        """The machine's installed units (those ``names``, else all), as at boot."""
        started = [
            Unit(self, u).start()
            for u in self.installed_units(machine)
            if not names or u.name in names
        ]
        assert started, f"no unit installed on {machine}"
        self.units.extend(started)
        return started

    def unit(self, machine: str, name: str) -> Unit:
        return next(
            u for u in reversed(self.units) if (u.unit.machine, u.unit.name) == (machine, name)
        )

    # ---- a client on the LAN ------------------------------------------------------------
    def gateway(self, machine: str) -> str:
        return f"http://{self.ip(machine)}:8600"


def call(
    url: str,
    *,
    body: dict[str, Any] | None = None,
    key: str | None = API_KEY,
    timeout: float = 10,
    method: str | None = None,
) -> tuple[int, dict[str, str], Any]:
    """(status, headers with title-cased names, JSON body or text) of one request;
    status 0: no answer."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            status, got = resp.status, {k.title(): v for k, v in resp.headers.items()}
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
        got = {k.title(): v for k, v in exc.headers.items()}
    except (OSError, urllib.error.URLError):
        return 0, {}, None
    try:
        return status, got, json.loads(raw)
    except ValueError:
        return status, got, raw.decode("utf-8", "replace")


def chat(base: str, model: str = "chat", **kw: Any) -> tuple[int, dict[str, str], Any]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return call(base + "/v1/chat/completions", body=body, **kw)


def draw(base: str, model: str = "image", **kw: Any) -> tuple[int, dict[str, str], Any]:
    body = {"model": model, "prompt": "a cat", "size": "256x256"}
    return call(base + "/v1/images/generations", body=body, **kw)


def embed(base: str, model: str = "embeddings", **kw: Any) -> tuple[int, dict[str, str], Any]:
    return call(base + "/v1/embeddings", body={"model": model, "input": "a cat"}, **kw)


@contextlib.contextmanager
def household(names: list[str] | None = None) -> Iterator[Household]:
    """Machines gpu-box and mini (and ``names``) on one LAN; everything they ran ends
    with them at the end."""
    need_ray()
    with lan(["gpu-box", "mini", *(names or [])]) as net:
        house = Household(net)
        try:
            yield house
        finally:
            for unit in house.units:
                unit._stop.set()
            for name in net.machines:
                with contextlib.suppress(Exception):
                    net[name].kill()


def daemon_pid(h: Household, machine: str) -> int:
    """The pid (in the host's table) of the node daemon running on ``machine``."""
    for pid in h.lan[machine].pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"accelmux.server.node_daemon" in cmdline and b"child_launch" not in cmdline:
            return pid
    raise AssertionError(f"no node daemon on {machine}")


def registered(h: Household, gateway: str) -> set[str]:
    """The nodes the gateway on ``gateway`` sees registered in Ray now."""
    status, _, body = call(h.gateway(gateway) + "/admin/cluster", key=ADMIN_KEY, timeout=3)
    return {n["node"] for n in body["nodes"] if n["registered"]} if status == 200 else set()
