"""POST /admin/plan's body becomes the arguments of ``accelmux plan``, one each, never a
shell string; a body it should not have sent is refused naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelmux.plan.command import changes_of
from accelmux.server.plan_api import PlanRequestError, plan_argv


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
