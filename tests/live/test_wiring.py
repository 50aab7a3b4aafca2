"""Batch jobs and the dashboard, mounted as ``accelmux serve`` mounts them: a job's
inputs go through the Manager like any request (batch class, windows)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from tests.live.support import base_config, fake, live, run, settle

from accelmux.server import wiring


async def run_job(lv: Any, model: str, inputs: list[str], tries: int = 1000) -> dict[str, Any]:
    """Submit a job of ``inputs`` to ``model`` and wait until it completes."""
    status, job, _ = await lv.post("/v1/jobs", json={"model": model, "inputs": inputs})
    assert status == 200, job
    for _ in range(tries):
        _, job = await lv.get(f"/v1/jobs/{job['id']}")
        if job["status"] == "completed":
            break
        await asyncio.sleep(0.02)
    assert job["status"] == "completed", job
    return dict(job)


def test_job_inputs_run_through_the_manager_and_results_persist(tmp_path: Path) -> None:
    cfg = base_config(
        embed={
            "kind": "embeddings",
            "class": "batch",
            "aliases": ["nomic"],
            "memory": {"weights": "64MiB", "per_unit": "1MiB"},
            "backend": fake(embedding_dim=8),
        },
        chat={"kind": "chat", "memory": {"weights": "64MiB"}, "backend": fake()},
    )

    async def body() -> None:
        async with live(cfg, tmp=tmp_path, extras=True) as lv:
            job = await run_job(lv, "nomic", [f"doc {i}" for i in range(70)], tries=200)
            _, page = await lv.get(f"/v1/jobs/{job['id']}/results?limit=100")
            vectors = [item["result"] for item in page["data"]]
            assert len(vectors) == 70 and all(len(v) == 8 for v in vectors)
            # the same text embeds to the same vector as the synchronous endpoint
            _, direct, _ = await lv.post(
                "/v1/embeddings", json={"model": "embed", "input": "doc 3"}
            )
            assert direct["data"][0]["embedding"] == vectors[3]
            # batches were Manager decisions like any request
            served = [
                d
                for d in lv.runtime.manager.log
                if type(d.action).__name__ == "Dispatch"
                and getattr(d.action, "request_id", "").startswith("job-")
            ]
            assert len(served) >= 3  # 70 inputs in batches of at most 32
            bad, err, _ = await lv.post("/v1/jobs", json={"model": "chat", "inputs": ["x"]})
            assert bad == 400 and err["error"]["param"] == "model"

    run(body())


def test_dashboard_is_served(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path, extras=True) as lv:
            status, page = await lv.get("/")
            assert status == 200 and "<html" in page.lower()
            status, history = await lv.get("/admin/history")
            assert status == 200 and isinstance(history, dict)

    run(body())


def test_job_batches_are_cut_short_beside_a_loaded_voice_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beside a loaded realtime service a job's batches are cut to about
    ``policy.batch_slice_s`` of what the last ones took once dispatched (the fake takes
    0.05 s a batch, so 0.01 s is a few texts); without one, or with the slice at 0, whole."""
    sizes: list[int] = []
    submit = wiring.submit_embeddings

    async def counted(runtime: Any, model: str, texts: list[str]) -> Any:
        sizes.append(len(texts))
        return await submit(runtime, model, texts)

    monkeypatch.setattr(wiring, "submit_embeddings", counted)
    embed = {
        "kind": "embeddings",
        "class": "batch",
        "memory": {"weights": "64MiB", "per_unit": "1MiB"},
        "backend": fake(embedding_dim=4, latency_s=0.05),
    }
    voice = {
        "kind": "asr",
        "class": "realtime",
        "residency": "pinned",
        "memory": {"weights": "64MiB", "per_unit": "1MiB"},
        "backend": fake(),
    }

    def batches(name: str, slice_s: float, **services: dict[str, Any]) -> list[int]:
        cfg = base_config(embed=embed, **services)
        cfg["policy"]["batch_slice_s"] = slice_s

        async def body() -> None:
            async with live(cfg, tmp=tmp_path / name, extras=True) as lv:
                if services:
                    await settle(lambda: lv.runtime.service_state("asr").holds_memory, 10.0)
                await run_job(lv, "embed", [f"doc {i}" for i in range(160)])

        sizes.clear()
        run(body())
        return list(sizes)

    beside = batches("voice", 0.01, asr=voice)
    # the runner's two workers may each claim a whole batch before any batch has ended
    assert beside[0] == 32 and beside.count(32) <= 2 and len(beside) > 5
    assert sum(beside) == 160
    assert batches("alone", 0.01) == [32] * 5
    assert batches("no-slice", 0.0, asr=voice) == [32] * 5
