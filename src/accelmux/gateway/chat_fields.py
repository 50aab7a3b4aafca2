"""The OpenAI fields beyond the messages that clients rely on, checked before admission.

``tools`` / ``tool_choice``, ``response_format``, ``stream_options``, ``stop``: each is
checked for its shape and answered with a 400 naming the field when it is wrong. What a
backend then does with them is the backend's part: the embedded llama.cpp model holds
its output to them with a grammar, an external server gets them unchanged, and a
backend that cannot do one answers a 400 naming it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from accelmux.gateway.errors import bad_field

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
TOOL_CHOICES = ("none", "auto", "required")
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
MAX_STOP = 4


def _tool_names(body: dict[str, Any]) -> list[str]:
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise bad_field("tools", "'tools' must be an array of functions")
    names: list[str] = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise bad_field(where, f"'{where}' must be an object of type 'function'")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise bad_field(f"{where}.function", f"'{where}.function' must be an object")
        name = fn.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise bad_field(
                f"{where}.function.name",
                f"'{where}.function.name' must be 1 to 64 letters, digits, '_' or '-'",
            )
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise bad_field(
                f"{where}.function.parameters",
                f"'{where}.function.parameters' must be a JSON schema object",
            )
        names.append(name)
    return names


def _tool_choice(body: dict[str, Any], names: list[str]) -> None:
    choice = body.get("tool_choice")
    if choice is None:
        return
    if not names:
        raise bad_field("tool_choice", "'tool_choice' needs 'tools'")
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise bad_field(
                "tool_choice", f"'tool_choice' must be one of {', '.join(TOOL_CHOICES)}"
            )
        return
    fn = choice.get("function") if isinstance(choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if name not in names:
        raise bad_field(
            "tool_choice", "'tool_choice' must be none, auto, required or one of the tools by name"
        )


def _response_format(body: dict[str, Any]) -> None:
    fmt = body.get("response_format")
    if fmt is None:
        return
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in RESPONSE_FORMATS:
        raise bad_field(
            "response_format",
            f"'response_format.type' must be one of {', '.join(RESPONSE_FORMATS)}",
        )
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise bad_field(
                "response_format",
                "'response_format.json_schema.schema' must be a JSON schema object",
            )


def _stream_options(body: dict[str, Any]) -> None:
    options = body.get("stream_options")
    if options is None:
        return
    if not isinstance(options, dict):
        raise bad_field("stream_options", "'stream_options' must be an object")
    if body.get("stream") is not True:
        raise bad_field("stream_options", "'stream_options' is only allowed with 'stream': true")
    usage = options.get("include_usage")
    if usage is not None and not isinstance(usage, bool):
        raise bad_field("stream_options", "'stream_options.include_usage' must be a boolean")


def _stop(body: dict[str, Any]) -> None:
    stop = body.get("stop")
    if stop is None or isinstance(stop, str):
        return
    if (
        not isinstance(stop, list)
        or len(stop) > MAX_STOP
        or not all(isinstance(s, str) and s for s in stop)
    ):
        raise bad_field("stop", f"'stop' must be a string or up to {MAX_STOP} non-empty strings")


def check_completion(body: dict[str, Any]) -> None:
    """The fields ``/v1/completions`` shares with chat."""
    _stream_options(body)
    _stop(body)


def check_chat(body: dict[str, Any]) -> int:
    """Check the fields of a chat request; returns the characters its tools add to the
    prompt (a backend describes them to the model)."""
    check_completion(body)
    names = _tool_names(body)
    _tool_choice(body, names)
    _response_format(body)
    extra = len(json.dumps(body["tools"])) if names else 0
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        extra += len(json.dumps(fmt["json_schema"]["schema"]))
    return extra
