"""POST /admin/plan's body becomes the arguments of ``accelmux plan``, one each, never a
shell string; a body it should not have sent is refused naming the key."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from accelmux.plan.command import changes_of
from accelmux.server.plan_api import PlanRequestError, plan_argv, plan_routes


def test_each_value_is_one_argument() -> None:
    argv = plan_argv(
        {
            "device_gib": "12,16",
            "add_device_gib": 8,
            "add_service": ["name=coder,catalogue=qwen2.5-7b"],
            "remove_service": ["completion"],
            "set": ["indexer.windows=01:00-05:00"],
            "policy": "llama-swap",
            "run": "2026",
        },
        Path("/data"),
    )
    assert argv == [
        "plan",
        "--data-dir=/data",
        "--json=-",
        "--device-gib=12,16",
        "--policy=llama-swap",
        "--run=2026",
        "--add-device-gib=8",
        "--add-service=name=coder,catalogue=qwen2.5-7b",
        "--remove-service=completion",
        "--set=indexer.windows=01:00-05:00",
    ]


def test_a_value_that_looks_like_an_option_stays_a_value() -> None:
    from accelmux.cli import build_parser

    argv = plan_argv({"remove_service": ["--data-dir=/etc"]}, Path("/data"))
    args = build_parser().parse_args(argv)
    assert args.data_dir == "/data" and args.remove_service == ["--data-dir=/etc"]
    assert changes_of(args)[0].remove_services == ("--data-dir=/etc",)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "must be a JSON object"),
        ({"data_dir": "/etc"}, "unknown key"),
        ({"policy": "a\nb"}, "one line of text"),
        ({"policy": "x" * 401}, "at most 400"),
        ({"compute_scale": "fast"}, "must be a number"),
        ({"compute_scale": True}, "must be a number"),
        ({"set": "a.b=c"}, "must be a list"),
        ({"set": ["x"] * 17}, "at most 16"),
        ({"add_service": [1]}, "one line of text"),
    ],
)
def test_a_bad_body_names_the_key(body: object, message: str) -> None:
    with pytest.raises(PlanRequestError, match=message):
        plan_argv(body, Path("/data"))


def test_no_body_plans_the_history_as_it_is_and_bad_json_is_named(tmp_path: Path) -> None:
    """An empty POST is the plan with no change (here: no history yet, so 422 with the
    reason), not a JSON error; a body that is not JSON is refused by name."""

    async def ask() -> tuple[int, str, int, str]:
        app = web.Application()
        app.add_routes(plan_routes(tmp_path))
        async with TestClient(TestServer(app)) as client:
            empty = await client.post("/admin/plan")
            broken = await client.post("/admin/plan", data=b"{not json")
            return empty.status, await empty.text(), broken.status, await broken.text()

    empty_status, empty_text, broken_status, broken_text = asyncio.run(ask())
    assert empty_status == 422, empty_text
    assert "invalid_plan_request" not in empty_text
    assert broken_status == 400 and "the body is not JSON" in broken_text
