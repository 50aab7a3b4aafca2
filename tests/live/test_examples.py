"""Every example config validates, and the fake stack serves every modality."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from tests.live.support import live, run

from accelmux.backends.fake_outputs import png_b64
from accelmux.config.load import load_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_example_is_valid(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.services


def test_fake_stack_serves_every_modality(tmp_path: Path) -> None:
    data = yaml.safe_load((EXAMPLES / "fake-stack.yaml").read_text())
    for svc in data["services"].values():
        svc["backend"].update({"latency_s": 0, "load_s": 0, "stream_chunk_s": 0})

    async def body() -> None:
        async with live(data, tmp=tmp_path, sample=True) as lv:
            msgs = [{"role": "user", "content": "hi"}]
            calls = [
                ("/v1/chat/completions", {"model": "gpt-4o-mini", "messages": msgs}),
                ("/v1/completions", {"model": "completion", "prompt": "x"}),
                ("/v1/embeddings", {"model": "embeddings", "input": ["a"]}),
                ("/v1/images/generations", {"model": "image", "prompt": "x", "size": "64x64"}),
                (
                    "/v1/detections",
                    {"model": "detect", "image": png_b64(b"seed", 8, 8)},
                ),
            ]
            for path, payload in calls:
                status, out, _ = await lv.post(path, json=payload)
                assert status == 200, (path, out)
            async with lv.session.post(
                lv.url + "/v1/audio/speech", json={"model": "tts", "input": "hello"}
            ) as resp:
                assert resp.status == 200 and (await resp.read())[:4] == b"RIFF"
            await lv.runtime.sample_once()
            status, snap = await lv.get("/admin/status")
            loaded = [s for s in snap["services"] if s["state"] == "loaded"]
            assert loaded and all(s["measured_bytes"] > 0 for s in loaded)
            # the fake reports in ledger units (scale 0.05 is undone): ~ weights + runtime
            for s in loaded:
                assert s["measured_bytes"] >= s["ledger"]["weights"] * 0.9
            assert snap["devices"][0]["measured"]["source"] == "virtual"

    run(body())
