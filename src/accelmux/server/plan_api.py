"""``POST /admin/plan``: the dashboard's plan page asks the daemon to plan from its history.

The body names the changes as ``accelmux plan`` spells them (every key optional)::

    {"device_gib": "12,16", "budget_gib": "", "add_device_gib": 8, "compute_scale": 2,
     "add_service": ["name=coder,catalogue=qwen2.5-7b,rate_per_h=20"],
     "remove_service": ["completion"], "set": ["indexer.windows=01:00-05:00"],
     "policy": "llama-swap", "last": "2h", "run": "20261206T..."}

The daemon runs ``accelmux plan --json -`` on its own ``data_dir`` in a child process
at a lower CPU priority (a replay is CPU work and the daemon's requests come first),
one plan at a time, within :data:`TIMEOUT_S`. Each value is one argument of that
command (``--key=value``, never a shell string); a plan that cannot be made answers 422
with the command's one-line reason (a history too short, a device no service fits).
Under ``/admin``: the admin key guards it like ``/admin/status``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from aiohttp import web

#: The longest a plan may run (seconds).
TIMEOUT_S = 300.0
#: CPU priority the plan runs at (nice value).
NICE = 10
MAX_TEXT = 400
MAX_ITEMS = 16
_TEXT_KEYS = ("device_gib", "budget_gib", "policy", "last", "run")
_NUMBER_KEYS = ("add_device_gib", "compute_scale")
_LIST_KEYS = ("add_service", "remove_service", "set")


class PlanRequestError(ValueError):
    """A body the plan page should not have sent; the message names the key."""


def _text(key: str, value: object) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT or "\n" in value or "\0" in value:
        raise PlanRequestError(f"{key} must be one line of text (at most {MAX_TEXT} characters)")
    return value.strip()


def plan_argv(body: object, data_dir: Path) -> list[str]:
    """The ``accelmux plan`` arguments for a request body (PlanRequestError when bad)."""
    if not isinstance(body, dict):
        raise PlanRequestError("the body must be a JSON object")
    unknown = sorted(set(body) - set(_TEXT_KEYS + _NUMBER_KEYS + _LIST_KEYS))
    if unknown:
        raise PlanRequestError(f"unknown key(s): {', '.join(unknown)}")
    argv = ["plan", f"--data-dir={data_dir}", "--json=-"]
    for key in _TEXT_KEYS:
        value = body.get(key)
        if value is not None and (text := _text(key, value)):
            argv.append(f"--{key.replace('_', '-')}={text}")
    for key in _NUMBER_KEYS:
        value = body.get(key)
        if value is None or value == "":
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise PlanRequestError(f"{key} must be a number")
        argv.append(f"--{key.replace('_', '-')}={value}")
    for key in _LIST_KEYS:
        items = body.get(key) or []
        if not isinstance(items, list) or len(items) > MAX_ITEMS:
            raise PlanRequestError(f"{key} must be a list of at most {MAX_ITEMS} texts")
        for item in items:
            if text := _text(key, item):
                argv.append(f"--{key.replace('_', '-')}={text}")
    return argv


def _error(status: int, message: str, code: str) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": "invalid_request_error", "code": code}},
        status=status,
    )


def plan_routes(data_dir: Path) -> list[web.RouteDef]:
    busy = asyncio.Lock()

    async def handler(request: web.Request) -> web.StreamResponse:
        try:
            # no body asks for the plan of the history as it is, with no change
            body = await request.json() if await request.read() else {}
            argv = plan_argv(body, data_dir)
        except json.JSONDecodeError as exc:
            return _error(400, f"the body is not JSON: {exc}", "invalid_plan_request")
        except (ValueError, UnicodeDecodeError) as exc:
            return _error(400, str(exc), "invalid_plan_request")
        if busy.locked():
            return _error(409, "a plan is being made already; try again when it is done", "busy")
        async with busy:
            return await _run(argv)

    return [web.post("/admin/plan", handler)]


async def _run(argv: list[str]) -> web.Response:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "accelmux.cli",
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, proc.pid, NICE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return _error(504, f"the plan took longer than {TIMEOUT_S:.0f} s", "plan_timeout")
    except asyncio.CancelledError:
        proc.kill()
        await proc.wait()
        raise
    if proc.returncode != 0:
        message = err.decode(errors="replace").strip().splitlines()
        reason = next((m for m in reversed(message) if m.strip()), "the plan failed")
        reason = reason.removeprefix("accelmux: ")
        status = 422 if proc.returncode == 1 else 400
        return _error(status, reason, "plan_refused")
    try:
        data: Any = json.loads(out)
    except ValueError:
        return _error(502, "the plan did not answer JSON", "plan_failed")
    return web.json_response(data)
