"""Batch jobs and the dashboard, mounted as ``accelmux serve`` mounts them: a job's
inputs go through the Manager like any request (batch class, windows)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.live.support import base_config, fake, live, run


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
            texts = [f"doc {i}" for i in range(70)]
            status, job, _ = await lv.post("/v1/jobs", json={"model": "nomic", "inputs": texts})
            assert status == 200, job
            for _ in range(200):
                _, job = await lv.get(f"/v1/jobs/{job['id']}")
                if job["status"] == "completed":
                    break
                await asyncio.sleep(0.02)
            assert job["status"] == "completed", job
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
