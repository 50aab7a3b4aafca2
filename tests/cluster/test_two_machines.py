"""Cluster mode on two machines, for real: gpu-box and mini, each its own network and
process namespace (its own address, ports, process table, home), a real LAN between
them. The cluster is brought up by typing docs/cluster.md's steps as written; then each
of the ways a household's cluster used to fail is tried on it: the LAN listener without
the key, a machine without the token, a streamed GET through the passthrough, a job read
back through the gateway, why a request went where it did, an agent's daemon killed, a
whole machine killed and brought back by its units alone, the Ray head's machine killed
and brought back, and no node left at all.

One cluster serves the whole module (bringing it up takes about a minute); the tests run
in order, and the later ones kill machines. Everything runs in namespaces a test needs
root to make: elsewhere the module skips, saying so.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from tests.cluster.household import (
    ADMIN_KEY,
    API_KEY,
    Household,
    call,
    chat,
    daemon_pid,
    draw,
    embed,
    household,
    registered,
    wait_until,
)
from tests.cluster.lan import namespaces_refused

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        namespaces_refused() is not None, reason=namespaces_refused() or "namespaces"
    ),
]


@pytest.fixture(scope="module")
def house() -> Iterator[Household]:
    with household(["laptop"]) as h:
        h.write_config()
        h.follow_the_steps()
        yield h


def health(h: Household, machine: str = "gpu-box") -> tuple[int, Any]:
    status, _, body = call(h.gateway(machine) + "/health", key=None, timeout=5)
    return status, body


def all_up(h: Household, machine: str = "gpu-box") -> bool:
    status, body = health(h, machine)
    return status == 200 and body["status"] == "ok" and body["alive"] == ["gpu-box", "mini"]


def test_the_documented_steps_serve_both_machines(house: Household) -> None:
    wait_until("both nodes serving", lambda: all_up(house))
    checks = [out for machine, command, out in house.outputs if command.startswith("curl")]
    assert len(checks) == 3, house.outputs
    assert json.loads(checks[0])["status"] == "ok"
    models = {m["id"] for m in json.loads(checks[1])["data"]}
    assert {"chat", "gpt-4o-mini", "image", "embeddings", "tts"} <= models
    assert "HTTP/1.1 200" in checks[2] and "X-Accelmux-Node: gpu-box" in checks[2]
    # Each machine's node serves its own services, from its own daemon.
    status, headers, _ = embed(house.gateway("gpu-box"))
    assert status == 200 and headers["X-Accelmux-Node"] == "mini"


def test_the_terminals_show_one_line_per_event_and_none_of_rays(house: Household) -> None:
    for term in house.terminals:
        lines = term.output().strip().splitlines()
        assert lines, term.command
        for line in lines:
            if term.command.startswith("accelmux node"):
                assert line.startswith("node "), f"{term.command}: {line!r}"
            else:
                assert "ray" not in line.lower() or "Ray cluster" in line, line
        text = term.output()
        assert "WARNING worker.py" not in text and "[state-dump]" not in text
        assert "Traceback" not in text


def test_the_lan_listener_refuses_anyone_without_the_clusters_key(house: Household) -> None:
    node = f"http://{house.ip('mini')}:8601"
    status, _, body = call(node + "/cluster/snapshot", key=None)
    assert status == 401 and body["error"]["code"] == "cluster_key_required"
    status, _, body = embed(node)  # the household's API key is not the cluster's key
    assert status == 401 and body["error"]["code"] == "cluster_key_required"
    req = urllib.request.Request(
        node + "/cluster/snapshot", headers={"X-Accelmux-Cluster-Key": "guess"}
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=5)
    assert err.value.code == 401
    err.value.close()
    # On the machine itself, its loopback listener is the ordinary daemon's.
    done = house.lan["mini"].run(["curl", "-s", "127.0.0.1:8601/health"])
    assert json.loads(done.stdout)["status"] == "ok"


def test_a_machine_without_the_token_is_refused_in_one_line(house: Household) -> None:
    laptop = house.lan["laptop"]
    for src in ("cluster.yaml",):
        (laptop.home / src).write_text((house.lan["mini"].home / src).read_text())
    done = laptop.run(["accelmux", "node", "--node", "mini", "-c", "cluster.yaml"], timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "accelmux: no cluster token on this machine: cluster mode uses Ray's token "
        "authentication; create it once on the head (RAY_AUTH_MODE=token ray "
        "get-auth-token --generate) and copy ~/.ray/auth_token to every machine "
        "(docs/cluster.md, step 1)"
    ]
    wrong = {"RAY_AUTH_TOKEN": "0" * 64}
    done = laptop.run(
        ["accelmux", "node", "--node", "mini", "-c", "cluster.yaml"], env=wrong, timeout=120
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"accelmux: node mini: the Ray cluster at {house.ip('gpu-box')}:6379 refused this "
        "machine's token: copy ~/.ray/auth_token from the head (docs/cluster.md, step 1)"
    )
    assert "Traceback" not in done.stdout + done.stderr


def test_a_get_through_the_passthrough_streams_as_it_comes(house: Household) -> None:
    url = house.gateway("gpu-box") + "/admin/nodes/mini/admin/events"
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    started = time.monotonic()
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        first = resp.readline()
        assert first.startswith(b": accelmux decisions")
        assert time.monotonic() - started < 5
        got: list[bytes] = []

        def read() -> None:
            with contextlib.suppress(OSError, ValueError):
                for line in resp:
                    if line.startswith(b"data: "):
                        got.append(line)
                        return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert embed(house.gateway("gpu-box"))[0] == 200
        reader.join(timeout=10)
        assert got, "no decision event arrived while the stream was open"


def test_a_job_is_read_back_through_the_gateway_with_the_key_that_submitted_it(
    house: Household,
) -> None:
    base = house.gateway("gpu-box")
    body = {"model": "embeddings", "inputs": ["a cat", "a dog"]}
    status, headers, job = call(base + "/v1/jobs", body=body)
    assert status in (200, 201, 202), job
    assert headers["X-Accelmux-Node"] == "mini"
    wait_until(
        "the job to finish",
        lambda: call(base + f"/v1/jobs/{job['id']}")[2].get("status") == "completed",
    )
    status, headers, shown = call(base + f"/v1/jobs/{job['id']}")
    assert status == 200 and shown["id"] == job["id"] and headers["X-Accelmux-Node"] == "mini"
    status, _, results = call(base + f"/v1/jobs/{job['id']}/results")
    assert status == 200 and len(results["data"]) == 2
    assert call(base + f"/v1/jobs/{job['id']}", key=None)[0] == 401
    assert call(base + f"/v1/jobs/{job['id']}", key="someone-else")[0] == 401
    assert job["id"] in {j["id"] for j in call(base + "/v1/jobs")[2]["data"]}
    assert call(base + "/v1/jobs/no-such-job")[0] == 404


def test_the_gateway_explains_where_a_request_went_and_why(house: Household) -> None:
    base = house.gateway("gpu-box")
    status, headers, _ = chat(base, "chat")
    assert status == 200
    rid = headers["X-Request-Id"]
    status, _, why = call(base + f"/admin/explain/{rid}", key=ADMIN_KEY)
    assert status == 200, why
    assert {c["node"] for c in why["considered"]} == {"gpu-box", "mini"}
    assert why["chosen"] == headers["X-Accelmux-Node"]
    for c in why["considered"]:
        assert {"free_bytes", "freeable_bytes", "readiness", "expected_wait_s"} <= set(c)
    assert why["chosen"] in why["why"]
    assert why["node_explain"]["request_id"] == rid  # the node's own Manager's lines
    assert call(base + f"/admin/explain/{rid}", key=API_KEY)[0] == 401


def test_an_agent_stops_cleanly_and_starts_again(house: Household) -> None:
    gpu = house.lan["gpu-box"]
    done = gpu.run(["accelmux", "node", "--stop", "--node", "gpu-box", "-c", "cluster.yaml"])
    assert done.returncode == 0 and done.stdout.strip() == "node gpu-box: stopped", done.stderr
    agent = next(t for t in house.terminals if t.command.startswith("accelmux node --node gpu"))
    wait_until("the agent to end", lambda: agent.proc.poll() is not None, 30)
    assert agent.proc.returncode == 0 and agent.output().strip().endswith("node gpu-box: stopped")
    wait_until("gpu-box down", lambda: health(house)[1]["down"] == ["gpu-box"], 5)
    again = gpu.run(["accelmux", "node", "--stop", "--node", "gpu-box", "-c", "cluster.yaml"])
    assert again.stdout.strip() == "node gpu-box: no agent runs here"
    command = agent.command
    house.type_command("gpu-box", command, ready="registered in the Ray cluster")
    wait_until("both nodes serving", lambda: all_up(house))


def test_a_killed_daemon_is_started_again_by_its_agent(house: Household) -> None:
    base = house.gateway("gpu-box")
    before = daemon_pid(house, "mini")
    os.kill(before, signal.SIGKILL)
    wait_until("mini marked down", lambda: health(house)[1]["down"] == ["mini"], timeout=5)
    took = wait_until("mini serving again", lambda: embed(base)[0] == 200, timeout=60)
    assert daemon_pid(house, "mini") != before
    agent = next(t for t in house.terminals if t.command.startswith("accelmux node --node mini"))
    assert "the daemon ended (signal 9); starting it again" in agent.output()
    assert took < 30


def test_a_lost_machine_leaves_the_others_serving_and_its_units_bring_it_back(
    house: Household,
) -> None:
    base = house.gateway("gpu-box")
    # mini runs from the units "Starting at boot" installs (and starts) from now on
    units = house.switch_to_units("mini")
    assert {u.unit.name for u in units} == {
        "accelmux-ray.service",
        "accelmux-node.service",
        "accelmux-gateway.service",
    }
    wait_until("mini serving from its units", lambda: all_up(house) and all_up(house, "mini"), 90)
    assert chat(base, "chat")[0] == 200
    answers: list[tuple[float, int]] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            asked = time.monotonic()
            answers.append((asked, chat(base, "chat", timeout=10)[0]))

    # More clients than gpu-box's slots for chat (4): chat runs on both machines.
    clients = [threading.Thread(target=load, daemon=True) for _ in range(8)]
    for c in clients:
        c.start()
    wait_until("chat running on mini too", lambda: _serving(house, "mini", "chat"), 30)
    killed = time.monotonic()
    house.lan["mini"].kill()
    down = wait_until("mini marked down", lambda: health(house)[1]["down"] == ["mini"], 5)

    def since_kill() -> list[int]:
        return [status for asked, status in answers if asked >= killed]

    wait_until("200 chat requests after the kill", lambda: len(since_kill()) >= 200, 60)
    stop.set()
    for c in clients:
        c.join(timeout=15)
    assert down < 2.0, f"mini was marked down {down:.2f} s after its machine died"
    results = since_kill()
    ok = results.count(200) / len(results)
    assert ok >= 0.99, f"{len(results)} requests for chat, {ok:.1%} answered"
    status, headers, body = embed(base)
    assert status == 503 and body["error"]["code"] == "node_unavailable"
    assert "'mini'" in body["error"]["message"] and headers["Retry-After"] == "5"
    status, body = health(house)
    assert status == 200 and body["status"] == "degraded" and body["down"] == ["mini"]
    assert time.monotonic() - killed < 30
    # It comes back: nothing typed, its units start as at boot.
    house.lan["mini"].boot()
    booted = time.monotonic()
    house.start_units("mini")
    wait_until("mini serving again", lambda: embed(base)[0] == 200, timeout=60)
    wait_until("full service", lambda: all_up(house), timeout=60 - (time.monotonic() - booted))
    wait_until(
        "mini registered in Ray again",
        lambda: registered(house, "gpu-box") == {"gpu-box", "mini"},
        timeout=90,
    )


def _serving(h: Household, node: str, service: str) -> bool:
    status, _, body = call(h.gateway("gpu-box") + "/admin/cluster", key=ADMIN_KEY)
    if status != 200:
        return False
    mine = next(n for n in body["nodes"] if n["node"] == node)
    return any(s["service"] == service and s["inflight"] > 0 for s in mine["services"])


def test_losing_the_head_machine_leaves_the_other_serving_and_it_re_forms(
    house: Household,
) -> None:
    mini = house.gateway("mini")  # mini's own gateway (its unit)
    house.switch_to_units("gpu-box")  # the head, from its units too
    wait_until("both serving", lambda: all_up(house, "mini") and all_up(house), timeout=90)
    wait_until(
        "the Ray cluster formed again from the units",
        lambda: registered(house, "mini") == {"gpu-box", "mini"},
        timeout=120,
    )
    ray = house.unit("mini", "accelmux-ray.service")
    ray_starts = ray.starts
    house.lan["gpu-box"].kill()  # the Ray head, its node, its gateway: everything
    wait_until("gpu-box marked down", lambda: health(house, "mini")[1]["down"] == ["gpu-box"], 5)
    results = [f(mini)[0] for _ in range(10) for f in (embed, chat)]
    assert results.count(200) == len(results), results
    status, _, body = draw(mini)
    assert status == 503 and "'gpu-box'" in body["error"]["message"]
    wait_until("mini's Ray node to end without its head", lambda: ray.starts > ray_starts, 60)
    assert [embed(mini)[0] for _ in range(5)] == [200] * 5
    house.lan["gpu-box"].boot()
    booted = time.monotonic()
    house.start_units("gpu-box")
    wait_until("full service", lambda: all_up(house, "mini"), timeout=60)
    assert draw(mini)[0] == 200
    assert time.monotonic() - booted < 60
    wait_until(
        "the Ray cluster re-formed",
        lambda: registered(house, "mini") == {"gpu-box", "mini"},
        timeout=120,
    )


def test_with_no_node_serving_health_is_503(house: Household) -> None:
    house.lan["gpu-box"].kill()
    house.unit("mini", "accelmux-node.service").stop()
    wait_until("no node", lambda: health(house, "mini")[0] == 503, timeout=30)
    status, body = health(house, "mini")
    assert body["status"] == "no_nodes" and body["alive"] == []
    assert sorted(body["down"]) == ["gpu-box", "mini"]
    status, _, err = chat(house.gateway("mini"), "chat")
    assert status == 503 and err["error"]["code"] == "node_unavailable"
