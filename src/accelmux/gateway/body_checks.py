"""The checks of a JSON body that grow with it, kept free of the web stack so that a
process of their own can run them (:func:`preflight`).

Strict JSON (``NaN``, ``Infinity`` and numbers beyond a float refused), a ceiling on
nesting, and the item counts of ``server.limits`` (messages, tools, content parts per
message, embedding inputs). A problem is a :class:`BodyProblem`, which the gateway turns
into its HTTP error.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import threading
from typing import Any

from accelmux.config.limits import LimitsConfig

#: How deeply a JSON body may nest (arrays and objects) before it is refused.
MAX_JSON_DEPTH = 64

#: (status, message, param, code) of a refused body: what crosses a process boundary.
Problem = tuple[int, str, str | None, str]


class BodyProblem(Exception):
    """A body refused by these checks."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None) -> None:
        super().__init__(status, message, code, param)
        self.status = status
        self.message = message
        self.code = code
        self.param = param

    def problem(self) -> Problem:
        return (self.status, self.message, self.param, self.code)


def _not_json_number(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of the range of a number")
    return value


def _as_is(obj: dict[str, Any]) -> dict[str, Any]:
    # a Python call per object: the parser then lets other threads (the event loop) run
    return obj


def too_deep() -> BodyProblem:
    return BodyProblem(
        400,
        f"request body nests arrays/objects deeper than {MAX_JSON_DEPTH} levels",
        "json_too_deep",
    )


def loads(raw: bytes) -> dict[str, Any]:
    """``raw`` as a JSON object, strictly (no NaN/Infinity, no number beyond a float)."""
    if not raw:
        raise BodyProblem(400, "request body is empty; expected a JSON object", "invalid_json")
    try:
        body = json.loads(
            raw, parse_constant=_not_json_number, parse_float=_finite, object_hook=_as_is
        )
    except (ValueError, UnicodeDecodeError) as exc:
        raise BodyProblem(400, f"request body is not valid JSON: {exc}", "invalid_json") from None
    except RecursionError:  # deeper than the parser's own stack allows
        raise too_deep() from None
    if not isinstance(body, dict):
        raise BodyProblem(400, "request body must be a JSON object", "invalid_json")
    return body


def depth_over(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``value`` nests lists/dicts more than ``limit`` levels (iteratively: a
    hostile body must not exhaust the stack here either)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def _over(param: str, count: int, limit: int, key: str) -> BodyProblem:
    return BodyProblem(
        400,
        f"'{param}' holds {count} items; the limit is {limit} (server.limits.{key})",
        "limit_exceeded",
        param,
    )


def check_items(body: dict[str, Any], limits: LimitsConfig, *, inputs: str | None = None) -> None:
    """The counts that make validation and token counting long, checked before them:
    messages, tools, each message's content parts, and the embedding inputs held by the
    field ``inputs``."""
    messages = body.get("messages")
    if isinstance(messages, list):
        if len(messages) > limits.messages:
            raise _over("messages", len(messages), limits.messages, "messages")
        for i, msg in enumerate(messages):
            content = msg.get("content") if isinstance(msg, dict) else None
            if isinstance(content, list) and len(content) > limits.content_parts:
                param = f"messages[{i}].content"
                raise _over(param, len(content), limits.content_parts, "content_parts")
    tools = body.get("tools")
    if isinstance(tools, list) and len(tools) > limits.tools:
        raise _over("tools", len(tools), limits.tools, "tools")
    items = body.get(inputs) if inputs else None
    if isinstance(items, list) and len(items) > limits.embedding_inputs:
        raise _over(str(inputs), len(items), limits.embedding_inputs, "embedding_inputs")


def preflight(raw: bytes, limits: LimitsConfig, inputs: str | None) -> Problem | None:
    """Parse and check ``raw`` (in a process of its own: the parse of a huge body holds
    its interpreter for the whole parse); only the verdict comes back, never the body."""
    try:
        body = loads(raw)
        check_items(body, limits, inputs=inputs)
        if depth_over(body):
            raise too_deep()
    except BodyProblem as exc:
        return exc.problem()
    return None


#: How much less CPU priority the check process takes than the daemon (``nice``): it
#: works for a client that sent a huge body, and must not slow everyone else's requests.
CHECK_NICENESS = 10


def lower_priority() -> None:
    """In a parse thread: this thread's CPU comes after the event loop's (Linux gives
    each thread its own niceness; elsewhere nothing changes)."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), CHECK_NICENESS)


def ignore_interrupts() -> None:
    """In the check process: Ctrl-C is the daemon's to handle (it stops the process), and
    its CPU comes after the daemon's (see :data:`CHECK_NICENESS`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.nice(CHECK_NICENESS)
