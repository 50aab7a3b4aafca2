"""The pieces of cluster mode that need no Ray: config keys, which services a node
builds, what the gateway reads of a request, a node's snapshot and view, the CLI's
one-line errors, and a single machine that never imports Ray."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from tests.cluster.support import env, write_config
from tests.live.support import fake

from accelmux.cli import main
from accelmux.cluster import ray_link
from accelmux.cluster.gateway import no_route_error
from accelmux.cluster.hosting import config_for_node, configured_hosts, hosts
from accelmux.cluster.requests import model_of, streams
from accelmux.cluster.snapshots import model_entries, node_snapshot, view_of
from accelmux.config.load import load_config_data
from accelmux.core.routing import Readiness, route
from accelmux.core.types import ServiceStatus
from accelmux.errors import ClusterError, ConfigError
from accelmux.runtime.daemon import Runtime


def config(**cluster: Any) -> dict[str, Any]:
    return {
        "devices": {"gpu": {"kind": "virtual", "capacity": "2GiB", "headroom": "128MiB"}},
        "cluster": cluster,
        "services": {
            "chat": {
                "kind": "chat",
                "aliases": ["gpt"],
                "nodes": ["b", "c"],
                "memory": {"weights": "256MiB", "kv_per_token": "16KiB", "kv_ceiling": "64MiB"},
                "backend": fake(),
            },
            "embed": {"kind": "embeddings", "memory": {"weights": "64MiB"}, "backend": fake()},
        },
    }


def test_a_service_lists_its_nodes_and_a_node_builds_only_its_own(tmp_path: Path) -> None:
    cfg = load_config_data(config(nodes=["a", "b", "c"]), "test")
    assert hosts(cfg, "chat", "b") and not hosts(cfg, "chat", "a") and hosts(cfg, "embed", "a")
    mine = config_for_node(cfg, "a", port=4321, data_dir=tmp_path)
    assert list(mine.services) == ["embed"]
    assert (mine.server.host, mine.server.port) == ("127.0.0.1", 4321)
    assert mine.server.data_dir == str(tmp_path)
    with pytest.raises(ClusterError, match="unknown node 'z'"):
        config_for_node(cfg, "z", port=1, data_dir=tmp_path)


def test_a_node_a_service_names_must_be_one_of_cluster_nodes() -> None:
    with pytest.raises(ConfigError, match=r"services\.chat\.nodes: unknown node \(got 'c'"):
        load_config_data(config(nodes=["a", "b"]), "test")
    load_config_data(config(), "test")  # no cluster.nodes: any name goes


def test_the_gateway_reads_the_model_and_whether_the_answer_streams() -> None:
    assert model_of("application/json", b'{"model": "chat", "stream": true}') == "chat"
    assert model_of("application/json", b"not json") is None
    assert model_of("application/json", b'{"model": 3}') is None
    boundary = "XyZ"
    form = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\nasr\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        f"Content-Type: audio/wav\r\n\r\nRIFF....\r\n--{boundary}--\r\n"
    ).encode()
    assert model_of(f"multipart/form-data; boundary={boundary}", form) == "asr"
    assert streams("/v1/chat/completions", "application/json", b'{"stream": true}')
    assert not streams("/v1/chat/completions", "application/json", b'{"model": "x"}')
    assert streams("/api/chat", "application/json", b'{"model": "x"}')  # Ollama's default
    assert not streams("/api/chat", "application/json", b'{"stream": false}')


def test_a_snapshot_comes_from_the_daemons_status_and_routes(tmp_path: Path) -> None:
    cfg = load_config_data(config(), "test")
    rt = Runtime(cfg, sample=False, data_dir=tmp_path)
    snap = node_snapshot("b", 9999, rt.status(), cfg)
    assert snap["node"] == "b" and snap["port"] == 9999
    chat = {s["service"]: s for s in snap["services"]}["chat"]
    assert chat["models"] == ["chat", "gpt"] and chat["state"] == "unloaded"
    assert chat["load_bytes"] == 256 * 1024**2
    view = view_of(snap, alive=True)
    assert view.serving("gpt").state is ServiceStatus.UNLOADED  # type: ignore[union-attr]
    assert route([view], "gpt").readiness is Readiness.FITS  # type: ignore[union-attr]
    assert not view_of(snap, alive=False).alive


def test_without_ray_cluster_mode_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ClusterError, match=r"pip install 'accelmux\[cluster\]'"):
        ray_link.import_ray()
    assert main(["serve", "--cluster", "127.0.0.1:6379"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"accelmux: {ray_link.NO_RAY}"


def test_an_unreachable_cluster_is_one_line_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write_config(tmp_path / "c.yaml", config(nodes=["a", "b", "c"]))
    code = main(["node", "--cluster", "127.0.0.1:1", "--node", "a", "-c", str(cfg)])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1
    assert err.startswith("accelmux: cannot join the Ray cluster at 127.0.0.1:1: nothing answers")


def test_an_unknown_node_name_is_one_line(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.yaml", config(nodes=["a", "b", "c"]))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "accelmux.cli",
            "node",
            "--node",
            "zz",
            "-c",
            str(cfg),
            "--cluster",
            "127.0.0.1:1",
        ],
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        "accelmux: unknown node 'zz': cluster.nodes lists a, b, c"
    ]


def test_a_single_machine_never_imports_ray() -> None:
    code = (
        "import sys\n"
        "import accelmux, accelmux.cli, accelmux.server.serve, accelmux.server.command\n"
        "import accelmux.server.node_agent, accelmux.cluster.gateway\n"
        "accelmux.cli.build_parser()\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_no_route_names_where_the_service_may_run() -> None:
    cfg = load_config_data(config(nodes=["a", "b", "c"]), "test")
    configured = configured_hosts(cfg)
    assert configured["gpt"] == ("chat", ("b", "c"))
    assert configured["embed"] == ("embed", ("a", "b", "c"))
    never_up = no_route_error(route([], "gpt"), 5.0, configured)  # type: ignore[arg-type]
    assert (never_up.status, never_up.code, never_up.retry_after_s) == (
        503,
        "node_unavailable",
        5.0,
    )
    assert "'b', 'c'" in never_up.message and "'chat'" in never_up.message
    lost_one = route([view_of(_snapshot("b"), alive=False)], "chat")
    err = no_route_error(lost_one, 5.0, configured)  # type: ignore[arg-type]
    assert err.status == 503
    assert "('b') are down; no live agent on 'c' either" in err.message
    unknown = no_route_error(route([], "nope"), 5.0, configured)  # type: ignore[arg-type]
    assert (unknown.status, unknown.code) == (404, "model_not_found")


def _snapshot(node: str) -> dict[str, Any]:
    return {
        "node": node,
        "port": 1,
        "stopping": False,
        "devices": {"gpu": {"budget_bytes": 1, "available_bytes": 1}},
        "services": [
            {
                "service": "chat",
                "kind": "chat",
                "models": ["chat", "gpt"],
                "state": "loaded",
                "inflight": 0,
                "waiting": 0,
                "concurrency": 1,
                "device": "gpu",
                "load_bytes": 1,
                "backing_off": False,
            }
        ],
    }


def test_the_model_list_is_the_union_with_the_best_state_and_the_nodes() -> None:
    loaded, cold = _snapshot("b"), _snapshot("a")
    cold["services"][0]["state"] = "unloaded"
    entries = model_entries([cold, loaded])
    assert [e["id"] for e in entries] == ["chat", "gpt"]
    assert entries[0] == {
        "id": "chat",
        "object": "model",
        "created": 0,
        "owned_by": "accelmux",
        "service": "chat",
        "kind": "chat",
        "state": "loaded",
        "nodes": ["a", "b"],
    }


def test_a_cluster_that_answers_but_never_lets_this_machine_join_is_given_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    forever = threading.Event()

    class StuckRay:
        def is_initialized(self) -> bool:
            return False

        def init(self, **_: Any) -> None:
            forever.wait()  # as ray.init does when this machine is not one of its nodes

    monkeypatch.setattr(ray_link, "import_ray", StuckRay)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        address = f"127.0.0.1:{listening.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(ClusterError, match=r"no answer within 0\.2 s"):
            ray_link.connect(address, timeout_s=0.2)
    assert time.monotonic() - started < 2
    forever.set()
