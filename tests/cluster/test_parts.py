"""The pieces of cluster mode that need no Ray cluster: config keys, which services a
node builds, what the gateway reads of a request, a node's snapshot and view (with the
memory it can free now), the cluster's key, the node listener's guard, the CLI's
one-line errors, and a single machine that never imports Ray."""

from __future__ import annotations

import json
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
from accelmux.cluster import ray_link, secret
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


def test_a_snapshot_comes_from_the_managers_picture_and_routes(tmp_path: Path) -> None:
    cfg = load_config_data(config(), "test")
    rt = Runtime(cfg, sample=False, data_dir=tmp_path)
    snap = node_snapshot("b", rt.manager.snapshot().as_dict(), cfg)
    assert snap["node"] == "b"
    chat = {s["service"]: s for s in snap["services"]}["chat"]
    assert chat["models"] == ["chat", "gpt"] and chat["state"] == "unloaded"
    assert chat["load_bytes"] == 256 * 1024**2 and chat["class"] == "interactive"
    assert chat["held_bytes"] == 0 and not chat["pinned"] and chat["load_s"] >= 0
    view = view_of(snap, alive=True, service_s={"chat": 0.25})
    on_b = view.serving("gpt")
    assert on_b is not None and on_b.state is ServiceStatus.UNLOADED and on_b.service_s == 0.25
    assert route([view], "gpt").readiness is Readiness.FITS  # type: ignore[union-attr]
    assert not view_of(snap, alive=False).alive
    assert len(json.dumps(snap)) < 2048


def test_a_view_counts_the_memory_a_node_can_free_now() -> None:
    gib = 1024**3
    snap = {
        "node": "a",
        "devices": {"gpu": {"budget_bytes": 8 * gib, "available_bytes": 1 * gib}},
        "services": [
            _service("big", "unloaded", load=4 * gib),
            _service("idle", "loaded", held=3 * gib, cls="interactive"),
            _service("pinned", "loaded", held=1 * gib, pinned=True),
            _service("busy", "loaded", held=2 * gib, inflight=1),
            _service("voice", "loaded", held=gib, cls="realtime"),
        ],
    }
    big = view_of(snap, alive=True).serving("big")
    assert big is not None and big.freeable_bytes == 3 * gib  # idle, evictable, same class
    assert route([view_of(snap, alive=True)], "big").readiness is Readiness.FREES  # type: ignore[union-attr]
    snap["services"][1]["inflight"] = 1  # now the only candidate is busy too
    assert route([view_of(snap, alive=True)], "big").readiness is Readiness.BLOCKED  # type: ignore[union-attr]


def _service(
    name: str,
    state: str,
    *,
    load: int = 1024**3,
    held: int = 0,
    cls: str = "interactive",
    pinned: bool = False,
    inflight: int = 0,
) -> dict[str, Any]:
    return {
        "service": name,
        "kind": "chat",
        "class": cls,
        "models": [name],
        "state": state,
        "pinned": pinned,
        "inflight": inflight,
        "waiting": 0,
        "concurrency": 1,
        "device": "gpu",
        "load_bytes": load,
        "held_bytes": held,
        "load_s": 1.0,
        "backing_off": False,
    }


def test_the_clusters_key_comes_from_rays_token_and_never_is_the_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert secret.find_token() is None
    with pytest.raises(ClusterError, match="no cluster token on this machine"):
        secret.require_token()
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("abc123\n")
    assert secret.find_token() == "abc123"
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "other"))
    (tmp_path / "other").write_text("from-path")
    assert secret.find_token() == "from-path"
    monkeypatch.setenv("RAY_AUTH_TOKEN", "from-env")
    assert secret.find_token() == "from-env"
    key = secret.listener_key("from-env")
    assert key != "from-env" and "from-env" not in key and len(key) == 64
    assert key == secret.listener_key("from-env") != secret.listener_key("other")
    assert secret.key_matches(key, key) and not secret.key_matches(None, key)


def test_without_ray_cluster_mode_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ClusterError, match=r"pip install 'accelmux\[cluster\]'"):
        ray_link.import_ray()
    assert main(["serve", "--cluster", "127.0.0.1:6379"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"accelmux: {ray_link.NO_RAY}"


def test_an_unreachable_cluster_is_one_report_line_of_the_link(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t0k3n")
    done = subprocess.run(
        [sys.executable, "-m", "accelmux.cluster.registry", "watch", "--cluster", "127.0.0.1:1"],
        env={**env(), "RAY_AUTH_TOKEN_PATH": str(token)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["event"] == "error" and not report["fatal"]
    assert report["message"].startswith(
        "cannot join the Ray cluster at 127.0.0.1:1: nothing answers there"
    )


def test_without_a_token_the_commands_say_so_in_one_line(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.yaml", config(nodes=["a", "b", "c"]))
    home = {**env(), "HOME": str(tmp_path)}
    home.pop("RAY_AUTH_TOKEN", None)
    home.pop("RAY_AUTH_TOKEN_PATH", None)
    for args in (
        ["node", "--node", "a", "-c", str(cfg), "--cluster", "127.0.0.1:1"],
        ["serve", "--cluster", "127.0.0.1:1", "-c", str(cfg)],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "accelmux.cli", *args],
            env=home,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 1, done.stderr
        assert done.stderr.strip().splitlines() == [f"accelmux: {secret.NO_TOKEN}"]


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
        "import accelmux.server.node_agent, accelmux.server.node_daemon\n"
        "import accelmux.cluster.gateway, accelmux.server.cluster_serve\n"
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
    assert "('b') are down; no live node on 'c' either" in err.message
    unknown = no_route_error(route([], "nope"), 5.0, configured)  # type: ignore[arg-type]
    assert (unknown.status, unknown.code) == (404, "model_not_found")


def _snapshot(node: str) -> dict[str, Any]:
    chat = _service("chat", "loaded", load=1, held=1)
    chat["models"] = ["chat", "gpt"]
    return {
        "node": node,
        "devices": {"gpu": {"budget_bytes": 1, "available_bytes": 1}},
        "services": [chat],
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
    monkeypatch.setenv("RAY_AUTH_TOKEN", "t0k3n")
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        address = f"127.0.0.1:{listening.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(ClusterError, match=r"no answer within 0\.2 s"):
            ray_link.connect(address, timeout_s=0.2)
    assert time.monotonic() - started < 2
    forever.set()
