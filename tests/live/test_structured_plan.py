"""The output plan of tools and response formats (models/structured.py), without a model:
which outputs the schema allows, how the output is read back, what the model is told."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelmux.errors import RequestError
from accelmux.models.structured import plan_output, prompt_messages, read_output

NAMES = st.lists(
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True),
    min_size=1,
    max_size=4,
    unique=True,
)
JSONABLE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


def _tools(names: list[str]) -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
        for n in names
    ]


def _call_names(schema: dict[str, Any]) -> list[str]:
    options = schema.get("anyOf", [schema])
    return [o["properties"]["name"]["const"] for o in options if "name" in o.get("properties", {})]


@given(NAMES, st.sampled_from(["auto", "required", None]))
def test_every_tool_is_callable_and_auto_may_answer(names: list[str], choice: str | None) -> None:
    body: dict[str, Any] = {"tools": _tools(names)}
    if choice is not None:
        body["tool_choice"] = choice
    plan = plan_output(body)
    assert plan.schema is not None and _call_names(plan.schema) == names
    answers = len(plan.schema.get("anyOf", [plan.schema])) - len(names)
    assert answers == (0 if choice == "required" else 1)
    assert all(n in plan.instructions for n in names)


@given(NAMES, st.dictionaries(st.text(max_size=6), JSONABLE, max_size=4), st.data())
def test_a_call_in_the_schema_shape_reads_back_as_a_tool_call(
    names: list[str], args: dict[str, Any], data: st.DataObject
) -> None:
    plan = plan_output({"tools": _tools(names)})
    name = data.draw(st.sampled_from(names))
    content, calls = read_output(plan, json.dumps({"name": name, "arguments": args}), "c1")
    assert content is None
    ((call),) = calls
    assert (call.id, call.name, json.loads(call.arguments)) == ("c1", name, args)


def test_named_choice_allows_only_that_tool_and_none_allows_none() -> None:
    tools = _tools(["a", "b"])
    named = plan_output(
        {"tools": tools, "tool_choice": {"type": "function", "function": {"name": "b"}}}
    )
    assert named.schema is not None and _call_names(named.schema) == ["b"]
    assert "anyOf" not in named.schema
    none = plan_output({"tools": tools, "tool_choice": "none"})
    assert (none.schema, none.tools) == (None, {})
    with pytest.raises(RequestError) as err:
        plan_output(
            {"tools": tools, "tool_choice": {"type": "function", "function": {"name": "c"}}}
        )
    assert err.value.field == "tool_choice"


def test_answers_reply_wrapped_or_in_the_response_format() -> None:
    plan = plan_output({"tools": _tools(["a"])})
    assert read_output(plan, '{"reply": "hello"}', "c") == ("hello", [])
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "f", "schema": schema}}
    plan = plan_output({"tools": _tools(["a"]), "response_format": fmt})
    assert plan.schema is not None and schema in plan.schema["anyOf"]
    assert read_output(plan, '{"x": 1}', "c") == ('{"x": 1}', [])
    assert read_output(plan, '{"name": "a", "argu', "c") == ('{"name": "a", "argu', [])  # cut short
    only_format = plan_output({"response_format": fmt})
    assert (only_format.schema, only_format.tools) == (schema, {})
    assert plan_output({"response_format": {"type": "json_object"}}).schema == {"type": "object"}
    assert plan_output({}).schema is None
    with pytest.raises(RequestError):
        plan_output({"response_format": {"type": "xml"}})


def test_history_with_tool_calls_and_results_becomes_plain_turns() -> None:
    plan = plan_output({"tools": _tools(["HassTurnOn"])})
    history = [
        {"role": "system", "content": "You run a home."},
        {"role": "user", "content": "Light on"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"function": {"name": "HassTurnOn", "arguments": '{"name": "x"}'}}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "done"},
    ]
    out = prompt_messages(history, plan)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("You run a home.") and "HassTurnOn" in out[0]["content"]
    assert json.loads(out[2]["content"]) == {"name": "HassTurnOn", "arguments": {"name": "x"}}
    assert out[3]["content"] == "Result of call_1: done"
