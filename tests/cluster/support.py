"""A local multi-node Ray cluster on this machine, with node agents and a gateway.

Ray is the ``cluster`` extra (``scripts/test`` installs it). When it is missing the
cluster tests FAIL saying how to install it; only ``ACCELMUX_SKIP_MODELS=1`` (the switch
for missing optional runtimes) turns that into a skip.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.live.support import free_port
from tests.real.support import installed, missing

import accelmux

SRC = Path(accelmux.__file__).resolve().parents[1]
INSTALL_RAY = "pip install -e '.[cluster]' (scripts/test does)"


def need_ray() -> Any:
    if not installed("ray"):
        missing("ray (the cluster extra)", INSTALL_RAY)
    import ray

    return ray


def env() -> dict[str, str]:
    """The environment of every process of the cluster: this checkout's accelmux first."""
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [out.get("PYTHONPATH")])])
    out["RAY_USAGE_STATS_ENABLED"] = "0"
    out.setdefault("RAY_DEDUP_LOGS", "0")
    return out


def accelmux_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "accelmux.cli", *args],
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def wait_until(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def get_json(url: str, timeout: float = 5.0) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, None


@dataclass
class LocalCluster:
    """A Ray head and extra nodes on this machine; node name -> Ray node."""

    cluster: Any
    address: str
    nodes: dict[str, Any] = field(default_factory=dict)

    def node_id(self, name: str) -> str:
        return str(self.nodes[name].node_id)

    def agent_args(self, name: str, config: Path) -> list[str]:
        """The ``accelmux`` arguments that start node ``name``'s agent."""
        return [
            "node",
            "--cluster",
            self.address,
            "--node",
            name,
            "-c",
            str(config),
            "--ray-node-id",
            self.node_id(name),
        ]

    def start_agent(self, name: str, config: Path) -> subprocess.CompletedProcess[str]:
        return accelmux_cli(*self.agent_args(name, config))

    def start_agents(self, names: list[str], config: Path) -> None:
        """Start several agents at once (each ``accelmux node`` joins Ray: a few seconds)."""
        procs = {
            name: subprocess.Popen(
                [sys.executable, "-m", "accelmux.cli", *self.agent_args(name, config)],
                env=env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name in names
        }
        try:
            for name, proc in procs.items():
                out, err = proc.communicate(timeout=120)
                assert proc.returncode == 0, f"accelmux node --node {name} failed:\n{out}\n{err}"
        finally:
            for proc in procs.values():  # none outlives a failed start
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()

    def kill(self, name: str) -> None:
        """End a Ray node at once (its raylet and its workers: the agent dies with it)."""
        self.cluster.remove_node(self.nodes.pop(name), allow_graceful=False)


@contextlib.contextmanager
def local_cluster(names: list[str], *, cpus: int = 1) -> Iterator[LocalCluster]:
    """A head (the first name) and one extra Ray node per further name, each declaring a
    ``node_NAME`` resource and some ``accelmux_device_mib``; all shut down at the end."""
    ray = need_ray()
    from ray.cluster_utils import Cluster

    # Ray's processes inherit this process's environment: this checkout's accelmux first.
    saved = dict(os.environ)
    os.environ.update({k: v for k, v in env().items() if k.startswith(("PYTHON", "RAY_"))})
    head, *rest = names
    try:
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": cpus,
                "resources": {f"node_{head}": 1, "accelmux_device_mib": 4096},
                "include_dashboard": False,
            },
        )
    except Exception as exc:
        os.environ.clear()
        os.environ.update(saved)
        pytest.fail(f"Ray could not start a local cluster: {exc}", pytrace=False)
    local = LocalCluster(cluster=cluster, address=cluster.address)
    local.nodes[head] = cluster.head_node
    try:
        for name in rest:
            local.nodes[name] = cluster.add_node(
                num_cpus=cpus, resources={f"node_{name}": 1, "accelmux_device_mib": 4096}
            )
        yield local
    finally:
        with contextlib.suppress(Exception):
            if ray.is_initialized():
                ray.shutdown()
        cluster.shutdown()
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def gateway(address: str, config: Path, *, port: int | None = None) -> Iterator[str]:
    """``accelmux serve --cluster`` in a subprocess (its output in ``gateway.log`` beside
    ``config``); its base URL."""
    port = port or free_port()
    log_path = config.with_name("gateway.log")
    with log_path.open("w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "accelmux.cli",
                "serve",
                "--cluster",
                address,
                "-c",
                str(config),
                "--port",
                str(port),
                "--log-level",
                "WARNING",
            ],
            env=env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            "the cluster gateway",
            lambda: proc.poll() is not None or get_json(url + "/health")[0] == 200,
            timeout=60,
        )
        assert proc.poll() is None, "the gateway exited:\n" + log_path.read_text("utf-8")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def write_config(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path
