"""Each service's objectives (latency, TTFT, TBT) judged on the live daemon, per request,
by the simulator's rule; attainment per service and per class over the last minutes in
``/admin/status``, ``/metrics``, the dashboard's data and ``accelmux top``; an external
server's batch size is what it reports running, not its ``-b`` flag."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from tests.live.support import base_config, fake, live, run
from tests.waiting import async_wait_until

from accelmux.backends.external import ExternalBackend
from accelmux.backends.server_metrics import reported_batch_size
from accelmux.config.backends import ExternalBackendConfig
from accelmux.runtime import live_slo, top
from accelmux.runtime.live_slo import LiveSlo, Objective, RequestTiming, met

LLM = Objective(latency_s=None, ttft_s=0.5, tbt_s=0.1, llm=True)


def test_the_simulators_rule_for_one_request() -> None:
    stream = RequestTiming(arrived=0.0)
    for t in (0.2, 0.25, 0.3, 0.35):
        stream.chunk(t)
    assert met(LLM, stream, 0.4)  # TTFT 0.2 s, mean TBT 0.05 s
    assert not met(Objective(ttft_s=0.1, llm=True), stream, 0.4)
    assert not met(Objective(tbt_s=0.01, llm=True), stream, 0.4)
    assert not met(Objective(latency_s=0.3), stream, 0.4)
    answer = RequestTiming(arrived=0.0)  # not streamed: the answer is the first token
    assert not met(LLM, answer, 0.6) and met(LLM, answer, 0.4)
    assert met(Objective(), answer, 99.0)  # no objective: served is met


def test_attainment_slides_per_service_and_per_class() -> None:
    now = [0.0]
    slo = LiveSlo(
        {"chat": LLM, "asr": Objective(latency_s=1.0)},
        {"chat": "interactive", "asr": "realtime", "tts": "realtime"},
        window_s=60.0,
        clock=lambda: now[0],
    )
    slo.record("chat", True)
    slo.record("chat", False)
    now[0] = 30.0
    slo.record("asr", True)
    assert slo.service("chat")["attainment"] == 0.5
    assert slo.service("chat")["objective"] == {"latency_s": None, "ttft_s": 0.5, "tbt_s": 0.1}
    assert slo.by_class()["realtime"] == {
        "window_s": 60.0,
        "requests": 1,
        "met": 1,
        "attainment": 1.0,
    }
    now[0] = 61.0  # chat's two requests left the window
    assert slo.service("chat")["requests"] == 0 and slo.service("chat")["attainment"] is None
    assert slo.by_class()["interactive"]["attainment"] is None


def _stack() -> dict[str, Any]:
    cfg = base_config()
    cfg["services"]["chat"]["backend"] = fake(stream_chunk_s=0.02)
    cfg["services"]["chat"]["slo"] = {"ttft_s": 5.0, "tbt_s": 0.001}  # TBT can't be met
    cfg["services"]["completion"]["slo"] = {"ttft_s": 5.0, "tbt_s": 5.0}
    cfg["services"]["embed"]["slo"] = {"latency_s": 5.0}
    cfg["services"]["embed"]["queue"] = {"limit": 0}  # a second request at once is refused
    return cfg


def test_objectives_are_judged_live_and_shown_everywhere(tmp_path: Path) -> None:
    async def body() -> tuple[dict[str, Any], str]:
        async with live(_stack(), tmp=tmp_path) as lv:
            client = lv.openai()
            for model in ("chat", "chat", "completion"):
                if model == "chat":
                    stream = await client.chat.completions.create(
                        model=model,
                        messages=[{"role": "user", "content": "hello there friend"}],
                        max_tokens=6,
                        stream=True,
                    )
                else:
                    stream = await client.completions.create(
                        model=model, prompt="once upon", max_tokens=6, stream=True
                    )
                assert [c async for c in stream]
            embedded = await client.embeddings.create(model="embed", input=["a", "b"])
            assert embedded.data
            await client.close()
            bad = await lv.post("/v1/chat/completions", json={"model": "chat", "messages": 3})
            assert bad[0] == 400  # the client's mistake: not judged
            _, snap = await lv.get("/admin/status")
            _, text = await lv.get("/metrics")
            return snap, text

    snap, text = run(body())
    by_name = {s["name"]: s for s in snap["services"]}
    chat, completion = by_name["chat"]["slo"], by_name["completion"]["slo"]
    embed = by_name["embed"]["slo"]
    assert (chat["requests"], chat["met"], chat["attainment"]) == (2, 0, 0.0)  # TBT missed
    assert (completion["requests"], completion["attainment"]) == (1, 1.0)
    assert embed["attainment"] == 1.0 and embed["objective"]["latency_s"] == 5.0
    assert by_name["tts"]["slo"]["requests"] == 0
    classes = snap["slo_classes"]
    assert classes["interactive"]["requests"] == 3 and classes["interactive"]["met"] == 1
    assert classes["batch"]["attainment"] == 1.0
    families = {f.name: f for f in text_string_to_metric_families(text)}
    per_service = {
        s.labels["service"]: s.value for s in families["accelmux_service_slo_attainment"].samples
    }
    assert per_service["chat"] == 0.0 and per_service["completion"] == 1.0
    per_class = {
        s.labels["class"]: s.value for s in families["accelmux_class_slo_attainment"].samples
    }
    assert per_class["interactive"] == pytest.approx(1 / 3, abs=1e-3)
    requests = {
        s.labels["service"]: s.value for s in families["accelmux_service_slo_requests"].samples
    }
    assert requests["chat"] == 2
    screen = top.plain(top.frame(top.View(url="http://x", status=snap), 200, 80))
    assert "SLO" in screen and "interactive 33%" in screen
    chat_row = next(line for line in screen.splitlines() if line.startswith("chat "))
    assert chat_row.rstrip().endswith("0%")


def test_a_refused_request_misses_its_objective(tmp_path: Path) -> None:
    cfg = base_config(
        a={
            "kind": "image",
            "memory": {"weights": "64MiB"},
            "queue": {"limit": 0},  # one at a time, nobody waits
            "slo": {"latency_s": 30},
            "backend": fake(latency_s=0.5),
        },
    )

    async def body() -> dict[str, Any]:
        async with live(cfg, tmp=tmp_path) as lv:
            req = {"model": "a", "prompt": "x", "size": "64x64"}
            first = asyncio.ensure_future(lv.post("/v1/images/generations", json=req))
            world = lv.runtime.manager.world
            await async_wait_until(lambda: world.services["a"].inflight, message="a runs")
            second = await lv.post("/v1/images/generations", json=req)
            assert second[0] == 429  # the queue is full: refused
            assert (await first)[0] == 200
            return (await lv.get("/admin/status"))[1]

    slo = next(s for s in run(body())["services"] if s["name"] == "a")["slo"]
    assert (slo["requests"], slo["met"], slo["attainment"]) == (2, 1, 0.5)


def test_an_external_servers_batch_size_is_what_it_reports_running(tmp_path: Path) -> None:
    cfg = ExternalBackendConfig(
        type="external",
        argv=["llama-server", "-m", "x.gguf", "-b", "512", "--port", "{port}"],
        metrics_path="/metrics",
        slots_path="/slots",
    )
    backend = ExternalBackend("chat", "chat", cfg, data_dir=tmp_path)
    measured = backend.describe()["measured"]
    assert measured["batch_size"] is None  # nothing read from the server yet
    assert measured["batch_tokens_flag"] == 512  # -b: tokens, not requests
    backend.server_stats = {"slots": 4, "slots_processing": 3, "requests_processing": 2.0}
    assert backend.describe()["measured"]["batch_size"] == 3  # /slots first
    backend.server_stats = {"requests_processing": 2.0}  # /metrics only (vLLM too)
    assert backend.describe()["measured"]["batch_size"] == 2
    assert reported_batch_size({}) is None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.0, 50.0), st.booleans(), st.booleans()), min_size=1, max_size=80
    ),
    st.integers(1, 8),
)
def test_the_counts_kept_as_requests_come_and_go_equal_a_count_from_scratch(
    steps: list[tuple[float, bool, bool]], kept: int
) -> None:
    """Attainment's counts are kept as judged requests enter and leave the window (and
    the oldest go past the limit): at every read they equal a count over what is kept."""
    now = [0.0]
    slo = LiveSlo({}, {"chat": "interactive"}, window_s=60.0, clock=lambda: now[0])
    seen: list[tuple[float, bool]] = []
    with patch.object(live_slo, "MAX_KEPT", kept):
        for gap, ok, read in steps:
            now[0] += gap
            slo.record("chat", ok)
            seen = [*seen, (now[0], ok)][-kept:]
            if read:
                inside = [ok for t, ok in seen if t >= now[0] - 60.0]
                assert slo._counts("chat", now[0]) == (len(inside), sum(inside))
