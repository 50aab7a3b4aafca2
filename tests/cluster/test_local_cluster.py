"""Cluster mode end to end: a Ray head and two extra nodes on this machine, a node agent on
each with its own fake services, one gateway (``accelmux serve --cluster``) in front, the
real ``openai`` client. Then a node is killed: what may run elsewhere is served there,
what lived only there gets a clear 503, and nothing hangs.

One cluster serves the whole module (it takes a few seconds to start); the tests run in
order and the last ones kill node ``b``.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.cluster.support import (
    LocalCluster,
    gateway,
    get_json,
    local_cluster,
    wait_until,
    write_config,
)
from tests.live.support import fake

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

NODES = ["a", "b", "c"]
LLM = {"weights": "256MiB", "kv_per_token": "16KiB", "kv_ceiling": "64MiB"}


def cluster_config(data_dir: Path) -> dict[str, Any]:
    return {
        "devices": {"gpu": {"kind": "virtual", "capacity": "2GiB", "headroom": "128MiB"}},
        "cluster": {
            "nodes": NODES,
            "snapshot_interval_s": 0.2,
            "snapshot_timeout_s": 1.0,
            "request_timeout_s": 30,
            "retry_after_s": 3,
        },
        "services": {
            # On b or c: b first (the tie goes to the name), c once b is gone.
            "chat": {
                "kind": "chat",
                "aliases": ["gpt-test"],
                "concurrency": 2,
                "memory": LLM,
                "nodes": ["b", "c"],
                "backend": fake(),
            },
            # Only on the head node a: the gateway's own machine.
            "embed": {
                "kind": "embeddings",
                "memory": {"weights": "64MiB", "per_unit": "1MiB"},
                "nodes": ["a"],
                "backend": fake(),
            },
            # Only on b: unavailable once b is gone.
            "solo": {"kind": "chat", "memory": LLM, "nodes": ["b"], "backend": fake()},
            # On b only too, slow to stream: in flight when b dies.
            "slow": {
                "kind": "chat",
                "memory": LLM,
                "nodes": ["b"],
                "backend": fake(stream_chunk_s=0.5),
            },
        },
        # No prewarming: a service loads where its first request goes, so where it runs
        # follows the routing alone.
        "policy": {"prewarm": False},
        "server": {"data_dir": str(data_dir), "drain_s": 1.0, "jobs": False, "dashboard": False},
    }


class Setup:
    def __init__(self, local: LocalCluster, url: str) -> None:
        self.local = local
        self.url = url

    def openai(self) -> Any:
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, timeout=20)

    def alive(self) -> dict[str, bool]:
        status, body = get_json(self.url + "/admin/cluster")
        assert status == 200
        return {n["node"]: n["alive"] for n in body["nodes"]}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("cluster")
    config = write_config(tmp / "cluster.yaml", cluster_config(tmp / "data"))
    with local_cluster(NODES) as local:
        local.start_agents(NODES, config)
        with gateway(local.address, config) as url:
            s = Setup(local, url)
            wait_until("three live nodes", lambda: s.alive() == dict.fromkeys(NODES, True))
            yield s


def chat(client: Any, model: str) -> tuple[str, str]:
    """(the answer's text, the node that served it)."""
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=8
    )
    answer = raw.parse()
    return answer.choices[0].message.content, raw.headers["x-accelmux-node"]


def test_requests_are_served_by_services_on_two_nodes(setup: Setup) -> None:
    with setup.openai() as client:
        served_by_two_nodes(client)


def served_by_two_nodes(client: Any) -> None:
    text, node = chat(client, "chat")
    assert text and node == "b"
    assert chat(client, "gpt-test")[1] == "b"  # an alias routes like its model
    raw = client.embeddings.with_raw_response.create(model="embed", input=["a cat", "a dog"])
    assert len(raw.parse().data) == 2 and raw.headers["x-accelmux-node"] == "a"
    models = {m.id for m in client.models.list()}
    assert {"chat", "gpt-test", "embed", "solo", "slow"} <= models


def test_a_streamed_answer_is_relayed_chunk_by_chunk(setup: Setup) -> None:
    with (
        setup.openai() as client,
        client.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "count"}],
            max_tokens=6,
            stream=True,
        ) as stream,
    ):
        chunks = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert len(chunks) > 1 and "".join(chunks)


def test_an_unknown_model_is_a_404_and_a_missing_one_a_400(setup: Setup) -> None:
    import openai

    with setup.openai() as client, pytest.raises(openai.NotFoundError) as err:
        chat(client, "no-such-model")
    assert err.value.body["code"] == "model_not_found"
    request = urllib.request.Request(
        setup.url + "/v1/chat/completions",
        data=b'{"messages": []}',
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as http:
        urllib.request.urlopen(request, timeout=5)
    assert http.value.code == 400
    http.value.close()


def test_the_ollama_api_streams_ndjson_through_the_gateway(setup: Setup) -> None:
    request = urllib.request.Request(
        setup.url + "/api/chat",
        data=json.dumps(
            {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
        ).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.headers["X-Accelmux-Node"] == "b"
        lines = [json.loads(line) for line in resp.read().splitlines() if line.strip()]
    assert len(lines) > 1 and lines[-1]["done"] is True
    status, tags = get_json(setup.url + "/api/tags")
    assert status == 200 and {"chat", "embed"} <= {m["name"] for m in tags["models"]}
    status, entry = get_json(setup.url + "/v1/models/gpt-test")
    assert status == 200 and entry["id"] == "gpt-test"


def test_the_admin_view_reaches_one_node_daemon(setup: Setup) -> None:
    status, body = get_json(setup.url + "/admin/nodes/a/admin/status")
    assert status == 200
    assert [s["name"] for s in body["services"]] == ["embed"]


def test_a_killed_node_fails_fast_and_its_services_move(setup: Setup) -> None:
    with setup.openai() as client, setup.openai() as streaming:
        killed_node_fails_fast(setup, client, streaming)


def killed_node_fails_fast(setup: Setup, client: Any, streaming: Any) -> None:
    import openai

    assert chat(client, "solo")[1] == "b"
    outcome: dict[str, Any] = {}
    chunks: list[Any] = []

    def stream_slowly() -> None:
        try:
            with streaming.chat.completions.create(
                model="slow",
                messages=[{"role": "user", "content": "go"}],
                max_tokens=200,
                stream=True,
            ) as stream:
                for chunk in stream:
                    chunks.append(chunk)
        except Exception as exc:  # what the client sees when the node dies mid-stream
            outcome["error"] = exc
        outcome["ended_at"] = time.monotonic()

    inflight = threading.Thread(target=stream_slowly)
    inflight.start()
    wait_until("a few chunks out", lambda: len(chunks) >= 3)
    killed_at = time.monotonic()
    setup.local.kill("b")
    inflight.join(timeout=30)
    assert not inflight.is_alive(), "a request in flight on the killed node hung"
    assert outcome["ended_at"] - killed_at < 10
    # The stream ended early (an error event or a broken stream), not with 200 chunks.
    assert "error" in outcome or len(chunks) < 200

    wait_until("node b marked down", lambda: setup.alive()["b"] is False, timeout=15)
    assert time.monotonic() - killed_at < 15

    # chat may also run on c: c's Manager loads it on demand.
    text, node = chat(client, "chat")
    assert text and node == "c"
    # solo lived only on b: a clear 503 at once, naming the lost node, with Retry-After.
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as err:
        chat(client, "solo")
    assert time.monotonic() - started < 2
    assert err.value.status_code == 503
    assert err.value.body["code"] == "node_unavailable"
    assert "'b'" in err.value.body["message"] and "solo" in err.value.body["message"]
    assert err.value.response.headers["retry-after"] == "3"
    # What lived on a is untouched.
    assert client.embeddings.create(model="embed", input="x").data
    models = {m.id for m in client.models.list()}
    assert "solo" not in models and "chat" in models


def test_the_cluster_view_names_the_lost_node(setup: Setup) -> None:
    status, body = get_json(setup.url + "/admin/cluster")
    assert status == 200
    down = {n["node"]: n for n in body["nodes"]}["b"]
    assert down["alive"] is False and down["error"]
    assert json.dumps(body)  # JSON all the way
