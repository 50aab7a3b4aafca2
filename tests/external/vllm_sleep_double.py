"""A test double of vLLM's OpenAI server in sleep mode (not vLLM: no model, no GPU).

It answers what accelmux asks of a vLLM started with ``--enable-sleep-mode``: ``/health``,
``/v1/models``, a minimal non-streamed ``/v1/chat/completions``, and, only when its
environment has ``VLLM_SERVER_DEV_MODE=1`` (as vLLM's server does), ``POST
/sleep?level=1``, ``POST /wake_up`` and ``GET /is_sleeping``. It holds ``--hold-mib`` MiB
of touched memory while awake (its "weights on the device") and frees them while asleep,
so a process-tree meter sees the drop; a wake takes them again. A chat request while
asleep answers 503.

Test controls: ``--hang-sleep`` (the sleep never answers), ``--refuse-wake`` (the wake
answers 500), ``--hang-wake`` (the wake never answers). ``/v1/models`` says how many
sleeps and wakes it served, whether it sleeps, and its pid.

Run: python tests/external/vllm_sleep_double.py --port 8701 --enable-sleep-mode
"""

from __future__ import annotations

import argparse
import asyncio
import os

from aiohttp import web

MIB = 1 << 20
STATE: dict[str, object] = {"sleeping": False, "sleeps": 0, "wakes": 0}
HELD: list[bytearray] = []
ARGS = argparse.Namespace()


def _hold(mib: int) -> None:
    block = bytearray(mib * MIB)
    for i in range(0, len(block), 4096):
        block[i] = 1
    HELD.append(block)


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def models(request: web.Request) -> web.Response:
    return web.json_response(
        {
            "object": "list",
            "data": [{"id": "double", "object": "model"}],
            **STATE,
            "pid": os.getpid(),
        }
    )


async def chat(request: web.Request) -> web.Response:
    body = await request.json()
    if STATE["sleeping"]:
        return web.json_response({"error": {"message": "the engine is asleep"}}, status=503)
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    return web.json_response(
        {
            "id": "double-1",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "double"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "awake"},
                    "finish_reason": "stop",
                }
            ],
            "usage": usage,
        }
    )


async def sleep(request: web.Request) -> web.Response:
    if ARGS.hang_sleep:
        await asyncio.sleep(3600)
    if not ARGS.enable_sleep_mode:
        return web.json_response({"error": "sleep mode is not enabled"}, status=500)
    if request.query.get("level", "1") != "1":
        return web.json_response({"error": "the double sleeps at level 1 only"}, status=400)
    HELD.clear()
    STATE["sleeping"] = True
    STATE["sleeps"] = int(str(STATE["sleeps"])) + 1
    return web.Response(status=200)


async def wake_up(request: web.Request) -> web.Response:
    if ARGS.hang_wake:
        await asyncio.sleep(3600)
    if ARGS.refuse_wake:
        return web.json_response({"error": "the double refuses to wake"}, status=500)
    if STATE["sleeping"]:
        _hold(ARGS.hold_mib)
    STATE["sleeping"] = False
    STATE["wakes"] = int(str(STATE["wakes"])) + 1
    return web.Response(status=200)


async def is_sleeping(request: web.Request) -> web.Response:
    return web.json_response({"is_sleeping": STATE["sleeping"]})


def make_app() -> web.Application:
    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    if os.environ.get("VLLM_SERVER_DEV_MODE") == "1":
        app.router.add_post("/sleep", sleep)
        app.router.add_post("/wake_up", wake_up)
        app.router.add_get("/is_sleeping", is_sleeping)
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--hold-mib", type=int, default=0)
    parser.add_argument("--max-model-len", type=int, default=0)
    parser.add_argument("--enable-sleep-mode", action="store_true")
    parser.add_argument("--hang-sleep", action="store_true")
    parser.add_argument("--refuse-wake", action="store_true")
    parser.add_argument("--hang-wake", action="store_true")
    parser.parse_args(namespace=ARGS)
    if ARGS.hold_mib:
        _hold(ARGS.hold_mib)
    print(f"vllm sleep double on {ARGS.host}:{ARGS.port}", flush=True)
    web.run_app(make_app(), host=ARGS.host, port=ARGS.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
