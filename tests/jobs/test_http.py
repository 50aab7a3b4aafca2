from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from accelmux.jobs import JobRunner, JobStore, RunnerSettings
from accelmux.jobs.http import JobLimits, job_routes

from .support import digest

Scenario = Callable[[TestClient[web.Request, web.Application]], Awaitable[None]]
SMALL = JobLimits(max_body_bytes=4096, max_inputs=5, max_input_chars=50, max_page=10)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    s = JobStore.open(tmp_path)
    yield s
    s.close()


async def fake_submit(model: str, texts: list[str]) -> list[str]:
    await asyncio.sleep(0)
    return [digest(t) for t in texts]


def serve(
    store: JobStore,
    scenario: Scenario,
    *,
    runner: JobRunner | None = None,
    limits: JobLimits | None = None,
    models: list[str] | None = None,
) -> None:
    async def main() -> None:
        app = web.Application()
        app.add_routes(
            job_routes(
                store, runner, limits=limits, models=None if models is None else lambda: models
            )
        )
        async with TestClient(TestServer(app)) as client, asyncio.timeout(20):
            await scenario(client)

    asyncio.run(main())


async def expect_error(response: Any, status: int, param: str | None, code: str) -> str:
    assert response.status == status
    body = await response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    assert error["code"] == code
    assert error["type"] == "invalid_request_error"
    return str(error["message"])


def test_create_show_and_list(store: JobStore) -> None:
    async def scenario(client: TestClient[web.Request, web.Application]) -> None:
        r = await client.post(
            "/v1/jobs", json={"model": "embed", "inputs": ["a", "b"], "metadata": {"k": "v"}}
        )
        assert r.status == 200
        job = await r.json()
        assert job["object"] == "job" and job["id"].startswith("job_")
        assert job["status"] == "queued" and job["model"] == "embed"
        assert job["metadata"] == {"k": "v"}
        assert job["request_counts"] == {
            "total": 2,
            "completed": 0,
            "failed": 0,
            "cancelled": 0,
            "pending": 2,
            "in_progress": 0,
        }
        assert isinstance(job["created_at"], int)
        shown = await (await client.get(f"/v1/jobs/{job['id']}")).json()
        assert shown == job
        listing = await (await client.get("/v1/jobs")).json()
        assert listing["object"] == "list"
        assert [j["id"] for j in listing["data"]] == [job["id"]]
        assert listing["first_id"] == listing["last_id"] == job["id"]
        assert listing["has_more"] is False

    serve(store, scenario)


def test_json_lines_upload(store: JobStore) -> None:
    async def scenario(client: TestClient[web.Request, web.Application]) -> None:
        body = '"first"\n\n{"input": "second"}\n"third"\n'
        r = await client.post(
            "/v1/jobs?model=embed", data=body, headers={"Content-Type": "application/jsonl"}
        )
        assert r.status == 200, await r.text()
        job = await r.json()
        assert job["request_counts"]["total"] == 3
        assert [item.index for item in store.results(job["id"])] == [0, 1, 2]
        texts = store._db.execute(
            "SELECT text FROM inputs WHERE job_id = ? ORDER BY idx", (job["id"],)
        ).fetchall()
        assert [t for (t,) in texts] == ["first", "second", "third"]

        r = await client.post(
            "/v1/jobs", data='"x"\n', headers={"Content-Type": "application/x-ndjson"}
        )
        await expect_error(r, 400, "model", "missing_field")
        r = await client.post(
            "/v1/jobs?model=embed", data='"x"\n7\n', headers={"Content-Type": "application/jsonl"}
        )
        message = await expect_error(r, 400, "inputs[1]", "invalid_type")
        assert "line 2" in message
        r = await client.post(
            "/v1/jobs?model=embed", data="not json\n", headers={"Content-Type": "application/jsonl"}
        )
        await expect_error(r, 400, "inputs", "invalid_json")

    serve(store, scenario)


BAD_BODIES: list[tuple[Any, str | None, str]] = [
    ({"inputs": ["a"]}, "model", "missing_field"),
    ({"model": 3, "inputs": ["a"]}, "model", "invalid_type"),
    ({"model": "m" * 201, "inputs": ["a"]}, "model", "invalid_value"),
    ({"model": "embed"}, "inputs", "missing_field"),
    ({"model": "embed", "inputs": "a"}, "inputs", "invalid_type"),
    ({"model": "embed", "inputs": []}, "inputs", "invalid_value"),
    ({"model": "embed", "inputs": ["a", "b", 3]}, "inputs[2]", "invalid_type"),
    ({"model": "embed", "inputs": ["a", ""]}, "inputs[1]", "invalid_value"),
    ({"model": "embed", "inputs": ["x" * 51]}, "inputs[0]", "input_too_long"),
    ({"model": "embed", "inputs": ["a"] * 6}, "inputs", "too_many_inputs"),
    ({"model": "embed", "input": ["a"]}, "input", "unknown_field"),
    ({"model": "embed", "inputs": ["a"], "metadata": {"k": 1}}, "metadata", "invalid_type"),
    (
        {"model": "embed", "inputs": ["a"], "metadata": {str(i): "" for i in range(17)}},
        "metadata",
        "invalid_value",
    ),
    (["model", "embed"], None, "invalid_json"),
]


@pytest.mark.parametrize(("body", "param", "code"), BAD_BODIES)
def test_bad_body_is_400_naming_the_field(
    store: JobStore, body: Any, param: str | None, code: str
) -> None:
    async def scenario(client: TestClient[web.Request, web.Application]) -> None:
        r = await client.post("/v1/jobs", json=body)
        await expect_error(r, 400, param, code)
        assert store.list_jobs()[0] == []

    serve(store, scenario, limits=SMALL)


def test_unparsable_oversized_and_wrong_type_bodies(store: JobStore) -> None:
    async def scenario(client: TestClient[web.Request, web.Application]) -> None:
        r = await client.post(
            "/v1/jobs", data=b"{not json", headers={"Content-Type": "application/json"}
        )
        await expect_error(r, 400, None, "invalid_json")
        r = await client.post("/v1/jobs", json={"model": "embed", "inputs": ["a" * 40] * 200})
        await expect_error(r, 413, None, "body_too_large")
        r = await client.post("/v1/jobs", data="hello", headers={"Content-Type": "text/plain"})
        await expect_error(r, 415, None, "unsupported_media_type")

    serve(store, scenario, limits=SMALL)


def test_unknown_model_is_refused_when_models_are_known(store: JobStore) -> None:
    async def scenario(client: TestClient[web.Request, web.Application]) -> None:
        r = await client.post("/v1/jobs", json={"model": "chat-xl", "inputs": ["a"]})
        message = await expect_error(r, 400, "model", "model_not_found")
        assert "embed" in message
        r = await client.post("/v1/jobs", json={"model": "embed", "inputs": ["a"]})
        assert r.status == 200

    serve(store, scenario, models=["embed"])


def test_unknown_job_is_404(store: JobStore) -> None:
    async def scenario(client: TestClient[web.Request, web.Application]) -> None:
        for method, path in [
            ("GET", "/v1/jobs/job_missing"),
            ("GET", "/v1/jobs/job_missing/results"),
            ("POST", "/v1/jobs/job_missing/cancel"),
        ]:
            r = await client.request(method, path)
            await expect_error(r, 404, "id", "job_not_found")

    serve(store, scenario)


def test_cancel(store: JobStore) -> None:
    async def scenario(client: TestClient[web.Request, web.Application]) -> None:
        job = await (await client.post("/v1/jobs", json={"model": "e", "inputs": ["a"]})).json()
        r = await client.post(f"/v1/jobs/{job['id']}/cancel")
        assert r.status == 200
        cancelled = await r.json()
        assert cancelled["status"] == "cancelled"
        assert cancelled["request_counts"]["cancelled"] == 1
        assert cancelled["finished_at"] is not None
        again = await client.post(f"/v1/jobs/{job['id']}/cancel")
        assert again.status == 200
        items = await (await client.get(f"/v1/jobs/{job['id']}/results")).json()
        assert items["data"][0]["status"] == "cancelled"

        done = store.create_job("e", ["b"])
        lease = store.claim(done.id, 1)
        assert lease is not None
        store.complete(lease, {0: "x"})
        r = await client.post(f"/v1/jobs/{done.id}/cancel")
        assert r.status == 409
        assert (await r.json())["error"]["code"] == "invalid_job_status"

    serve(store, scenario)


def test_runs_and_pages_results(store: JobStore) -> None:
    texts = [f"t{i}" for i in range(23)]

    async def scenario(client: TestClient[web.Request, web.Application]) -> None:
        job = await (await client.post("/v1/jobs", json={"model": "e", "inputs": texts})).json()
        while True:
            view = await (await client.get(f"/v1/jobs/{job['id']}")).json()
            if view["status"] == "completed":
                break
            await asyncio.sleep(0.01)
        assert view["request_counts"]["completed"] == 23
        seen: list[dict[str, Any]] = []
        offset: int | None = 0
        while offset is not None:
            page = await (
                await client.get(f"/v1/jobs/{job['id']}/results?offset={offset}&limit=10")
            ).json()
            assert page["object"] == "list" and page["total"] == 23 and page["limit"] == 10
            seen.extend(page["data"])
            offset = page["next_offset"]
            assert page["has_more"] == (offset is not None)
        assert [item["index"] for item in seen] == list(range(23))
        assert [item["result"] for item in seen] == [digest(t) for t in texts]
        assert {item["status"] for item in seen} == {"completed"}
        assert {item["error"] for item in seen} == {None}
        for query, param in [
            ("limit=0", "limit"),
            ("limit=11", "limit"),
            ("limit=x", "limit"),
            ("offset=-1", "offset"),
        ]:
            r = await client.get(f"/v1/jobs/{job['id']}/results?{query}")
            await expect_error(
                r, 400, param, "invalid_value" if query != "limit=x" else "invalid_type"
            )

    async def with_runner() -> None:
        settings = RunnerSettings(batch_size=4, max_outstanding=2, idle_poll_s=30.0)
        runner = JobRunner(store, fake_submit, settings=settings)
        await runner.start()
        try:
            app = web.Application()
            app.add_routes(job_routes(store, runner, limits=JobLimits(max_page=10)))
            async with TestClient(TestServer(app)) as client, asyncio.timeout(20):
                await scenario(client)
        finally:
            await runner.stop()

    asyncio.run(with_runner())


def test_list_pages_with_after(store: JobStore) -> None:
    ids = [store.create_job("e", [str(i)]).id for i in range(3)]

    async def scenario(client: TestClient[web.Request, web.Application]) -> None:
        first = await (await client.get("/v1/jobs?limit=2")).json()
        assert [j["id"] for j in first["data"]] == [ids[2], ids[1]]
        assert first["has_more"] is True
        second = await (await client.get(f"/v1/jobs?limit=2&after={first['last_id']}")).json()
        assert [j["id"] for j in second["data"]] == [ids[0]]
        assert second["has_more"] is False
        r = await client.get("/v1/jobs?after=job_nope")
        await expect_error(r, 400, "after", "invalid_value")
        r = await client.get("/v1/jobs?limit=1000")
        await expect_error(r, 400, "limit", "invalid_value")

    serve(store, scenario)


def test_internal_error_is_500_in_the_same_shape(store: JobStore) -> None:
    async def scenario(client: TestClient[web.Request, web.Application]) -> None:
        store.close()  # every store call now fails
        r = await client.get("/v1/jobs")
        assert r.status == 500
        body = json.loads(await r.text())
        assert body["error"]["type"] == "server_error"

    serve(store, scenario)
