"""Tools and structured output for a local model: what its output must look like.

An OpenAI chat request may carry ``tools`` (with ``tool_choice``) and a
``response_format`` (``json_object`` or ``json_schema``). A small local model does not
follow such instructions by itself, so :func:`plan_output` turns them into one JSON
schema the output must match; the model wrapper compiles it into a llama.cpp grammar
(``LlamaGrammar.from_json_schema``), which makes every sampled token keep the output
valid. The output is then read back by :func:`read_output` as an OpenAI message:

* a tool call is the JSON object ``{"name": <tool>, "arguments": {...}}`` (the
  arguments follow that tool's ``parameters`` schema);
* with ``tool_choice: auto`` the model may answer instead: with the response format's
  JSON when one is given, else with ``{"reply": "<text>"}``, whose text becomes the
  message content;
* ``tool_choice: required`` (or a named function) allows only tool calls;
  ``tool_choice: none`` allows none.

The tools and the expected format are described to the model in a system message
(:func:`prompt_messages`), which also turns ``tool`` result messages and assistant tool
calls of the history into text the chat template can hold.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from accelmux.errors import RequestError

REPLY_KEY = "reply"


@dataclass(frozen=True, slots=True)
class OutputPlan:
    """What one request's output must be.

    ``schema``: the JSON schema the whole output follows (None: free text).
    ``tools``: the tools the model may call (name -> parameters schema).
    ``wrapped_reply``: a plain answer comes as ``{"reply": ...}`` (tools, no format).
    ``instructions``: the system text that tells the model all this.
    """

    schema: dict[str, Any] | None
    tools: dict[str, dict[str, Any]]
    wrapped_reply: bool
    instructions: str

    @property
    def constrained(self) -> bool:
        return self.schema is not None


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it


def _tool_specs(body: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    specs: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(body.get("tools") or []):
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise RequestError(f"tools[{i}] must be a function with a name", field="tools")
        params = fn.get("parameters")
        specs[fn["name"]] = dict(params) if isinstance(params, Mapping) else {"type": "object"}
    return specs


def _descriptions(body: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for tool in body.get("tools") or []:
        fn = tool.get("function") or {}
        out[str(fn.get("name"))] = str(fn.get("description") or "")
    return out


def _chosen_tools(body: Mapping[str, Any], specs: dict[str, dict[str, Any]]) -> tuple[str, bool]:
    """(mode, may_answer): mode is none / auto / required / a tool name."""
    choice = body.get("tool_choice")
    if not specs or choice == "none":
        return "none", True
    if choice is None or choice == "auto":
        return "auto", True
    if choice == "required":
        return "required", False
    if isinstance(choice, Mapping):
        name = (choice.get("function") or {}).get("name")
        if name not in specs:
            raise RequestError(
                f"tool_choice names {name!r}, which is not one of the tools", field="tool_choice"
            )
        return str(name), False
    raise RequestError(
        "tool_choice must be none, auto, required or a function", field="tool_choice"
    )


def _answer_schema(body: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The schema of a (non-tool) answer, and how to describe it; None: free text."""
    fmt = body.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, Mapping) else None
    if kind == "json_object":
        return {"type": "object"}, "Answer with one JSON object."
    if kind == "json_schema":
        spec = fmt.get("json_schema") if isinstance(fmt, Mapping) else None
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if not isinstance(schema, Mapping):
            raise RequestError(
                "response_format.json_schema.schema must be a JSON schema object",
                field="response_format",
            )
        text = json.dumps(schema, separators=(",", ":"))
        return dict(schema), f"Answer with JSON that follows this schema: {text}"
    if kind in (None, "text"):
        return None, ""
    raise RequestError(
        f"response_format type {kind!r} is not supported (text, json_object, json_schema)",
        field="response_format",
    )


def _call_schema(name: str, params: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": params},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def plan_output(body: Mapping[str, Any]) -> OutputPlan:
    """The output plan of a chat request (raises RequestError naming a bad field)."""
    specs = _tool_specs(body)
    mode, may_answer = _chosen_tools(body, specs)
    answer, answer_text = _answer_schema(body)
    if mode == "none":
        return OutputPlan(answer, {}, False, answer_text)
    callable_tools = specs if mode in ("auto", "required") else {mode: specs[mode]}
    options = [_call_schema(name, params) for name, params in callable_tools.items()]
    wrapped = False
    if may_answer:
        if answer is None:
            wrapped = True
            answer = {
                "type": "object",
                "properties": {REPLY_KEY: {"type": "string"}},
                "required": [REPLY_KEY],
                "additionalProperties": False,
            }
            answer_text = 'To answer without a function, reply with {"reply": "<your answer>"}.'
        options.append(answer)
    described = _descriptions(body)
    lines = ["You can call these functions:"]
    for name, params in callable_tools.items():
        about = f": {described.get(name)}" if described.get(name) else ""
        lines.append(f"- {name}{about} Parameters: {json.dumps(params, separators=(',', ':'))}")
    lines.append('To call one, reply with {"name": "<function>", "arguments": {...}}.')
    if answer_text:
        lines.append(answer_text)
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    return OutputPlan(schema, callable_tools, wrapped, "\n".join(lines))


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def prompt_messages(messages: Sequence[Any], plan: OutputPlan) -> list[dict[str, str]]:
    """The conversation as plain system/user/assistant text, with the plan's instructions."""
    out: list[dict[str, str]] = []
    for m in messages:
        if not isinstance(m, Mapping):
            continue
        role = str(m.get("role"))
        content = _text(m.get("content"))
        if role == "tool":
            who = m.get("name") or m.get("tool_call_id") or "function"
            out.append({"role": "user", "content": f"Result of {who}: {content}"})
            continue
        if role == "assistant" and m.get("tool_calls"):
            calls = []
            for call in m.get("tool_calls") or []:
                fn = call.get("function") if isinstance(call, Mapping) else None
                if isinstance(fn, Mapping):
                    said = {"name": fn.get("name"), "arguments": _args(fn.get("arguments"))}
                    calls.append(json.dumps(said))
            content = "\n".join([c for c in (content, *calls) if c])
        elif role == "developer":
            role = "system"
        out.append({"role": role, "content": content})
    if plan.instructions:
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + plan.instructions}
        else:
            out.insert(0, {"role": "system", "content": plan.instructions})
    return out


def _args(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def read_output(plan: OutputPlan, text: str, call_id: str) -> tuple[str | None, list[ToolCall]]:
    """(content, tool calls) of the model's output under ``plan``.

    Output cut short by ``max_tokens`` is not valid JSON: it is returned as content,
    unparsed (the finish reason says ``length``).
    """
    if not plan.tools:
        return text, []
    try:
        obj = json.loads(text)
    except ValueError:
        return text, []
    if isinstance(obj, dict) and set(obj) == {"name", "arguments"} and obj["name"] in plan.tools:
        args = json.dumps(obj["arguments"], separators=(",", ":"))
        return None, [ToolCall(id=call_id, name=str(obj["name"]), arguments=args)]
    if plan.wrapped_reply and isinstance(obj, dict) and isinstance(obj.get(REPLY_KEY), str):
        return obj[REPLY_KEY], []
    return text, []


def tool_calls_json(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    """Tool calls in the OpenAI message shape (``index`` included, for stream deltas)."""
    return [
        {
            "index": i,
            "id": c.id,
            "type": "function",
            "function": {"name": c.name, "arguments": c.arguments},
        }
        for i, c in enumerate(calls)
    ]
