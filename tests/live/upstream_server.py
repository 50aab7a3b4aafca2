"""A small OpenAI-compatible server used as the EXTERNAL backend in tests and the bench.

It is a stand-in for llama-server, vLLM or a whisper server: ``/health``, ``/v1/models``,
``/v1/chat/completions`` and ``/v1/completions`` (both with SSE streaming),
``/v1/embeddings`` and ``/v1/audio/transcriptions`` (multipart). Test controls: a chat
message whose content starts with ``sleep:N`` makes the answer wait N seconds;
``POST /crash`` makes the process exit at once (code 3). A chat answer echoes the
request body it received in ``received``.
A message ``alloc:N`` makes the answer hold N MiB (touched) for half a second first.
``--hold-mib N`` holds N MiB from the start (a model's weights); ``--helper`` starts a
helper child process in the server's process group (its pid in ``/v1/models``), as
servers with worker processes do.
``--startup-delay`` delays readiness; the argv it was started with is echoed in
``/v1/models`` (so tests can check ``{ctx_size}``/``{parallel}`` templating), and so is
``CUDA_VISIBLE_DEVICES``. ``--gpu-memory-utilization`` is accepted (vLLM's flag, for
tests of ``{gpu_memory_utilization}``) and only echoed.

Run: python tests/live/upstream_server.py --port 8700
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

from aiohttp import web

STARTED = time.monotonic()
ARGS = argparse.Namespace(startup_delay=0.0)
HELD: list[bytearray] = []
HELPER: list[subprocess.Popen[bytes]] = []
MIB = 1 << 20
USAGE = {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}


def _touched(mib: int) -> bytearray:
    block = bytearray(mib * MIB)
    for i in range(0, len(block), 4096):
        block[i] = 1
    return block


def _reply(text: str) -> str:
    return f"upstream echo: {text[:40]}"


def _last_text(body: dict[str, object]) -> str:
    messages = body.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        return str(messages[-1].get("content", ""))
    return str(body.get("prompt", ""))


async def _maybe_sleep(text: str) -> None:
    if text.startswith("alloc:"):
        block = _touched(int(text.split(":", 1)[1].split(maxsplit=1)[0]))
        await asyncio.sleep(0.5)
        del block
    if text.startswith("sleep:"):
        await asyncio.sleep(float(text.split(":", 1)[1].split(maxsplit=1)[0]))


async def health(request: web.Request) -> web.Response:
    if time.monotonic() - STARTED < ARGS.startup_delay:
        return web.json_response({"status": "loading"}, status=503)
    return web.json_response({"status": "ok"})


async def models(request: web.Request) -> web.Response:
    return web.json_response(
        {
            "object": "list",
            "data": [{"id": "upstream-model", "object": "model"}],
            "argv": sys.argv[1:],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "helper_pid": HELPER[0].pid if HELPER else None,
        }
    )


async def chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    text = _last_text(body)
    await _maybe_sleep(text)
    reply = _reply(text)
    model = body.get("model", "upstream-model")
    is_chat = request.path.endswith("/chat/completions")
    if body.get("stream"):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i, word in enumerate(reply.split(" ")):
            piece = word if i == 0 else " " + word
            if is_chat:
                choice = {"index": 0, "delta": {"content": piece}, "finish_reason": None}
                obj = {"id": "up-1", "object": "chat.completion.chunk", "model": model}
            else:
                choice = {"index": 0, "text": piece, "finish_reason": None}
                obj = {"id": "up-1", "object": "text_completion", "model": model}
            obj["created"] = 0
            obj["choices"] = [choice]
            await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        if (body.get("stream_options") or {}).get("include_usage"):
            last = {"id": "up-1", "object": "chat.completion.chunk", "model": model}
            last.update(created=0, choices=[], usage=USAGE)
            await resp.write(b"data: " + json.dumps(last).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
    usage = USAGE
    if is_chat:
        return web.json_response(
            {
                "id": "up-1",
                "object": "chat.completion",
                "created": 0,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": reply},
                        "finish_reason": "stop",
                    }
                ],
                "usage": usage,
                "received": body,  # what reached the upstream, for pass-through tests
            }
        )
    return web.json_response(
        {
            "id": "up-1",
            "object": "text_completion",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "text": reply, "finish_reason": "stop"}],
            "usage": usage,
        }
    )


async def embeddings(request: web.Request) -> web.Response:
    body = await request.json()
    items = body["input"] if isinstance(body["input"], list) else [body["input"]]
    data = [{"object": "embedding", "index": i, "embedding": [0.5, 0.5]} for i in range(len(items))]
    return web.json_response({"object": "list", "data": data, "model": body.get("model")})


async def transcriptions(request: web.Request) -> web.Response:
    form = await request.post()
    audio = form.get("file")
    if not isinstance(audio, web.FileField):
        return web.json_response({"error": {"message": "file missing"}}, status=400)
    size = len(audio.file.read())
    return web.json_response(
        {
            "text": f"upstream heard {audio.filename} ({audio.content_type}, {size} bytes) "
            f"model={form.get('model')}"
        }
    )


async def crash(request: web.Request) -> web.Response:
    os._exit(3)


def make_app() -> web.Application:
    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/completions", chat)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_post("/v1/audio/transcriptions", transcriptions)
    app.router.add_post("/crash", crash)
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--startup-delay", type=float, default=0.0)
    parser.add_argument("--ctx-size", type=int, default=0)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--hold-mib", type=int, default=0)
    parser.add_argument("--helper", action="store_true")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.0)
    args = parser.parse_args()
    ARGS.startup_delay = args.startup_delay
    if args.hold_mib:
        HELD.append(_touched(args.hold_mib))
    if args.helper:
        HELPER.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"]))
    print(f"upstream listening on {args.host}:{args.port} ctx={args.ctx_size}", flush=True)
    web.run_app(make_app(), host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
