"""Home clients against the real default stack: what Home Assistant's ``llama_cpp``
conversation integration sends (with the ``openai`` client), and the ``ollama`` client,
answered by the real SmolLM2 model under llama.cpp grammars."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import ollama
import openai
import pytest
from tests.real.support import need

from .support import NEEDED, Daemon, run_daemon, stack_config

pytestmark = [pytest.mark.real, pytest.mark.slow]

#: Two of the tools Home Assistant's LLM API offers, in the shape it sends them.
HA_TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "HassTurnOn",
            "description": "Turns on/opens/presses a device or entity",
            "parameters": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "area": {"type": "string"},
                    "domain": {"type": "array", "items": {"type": "string"}},
                },
                "required": [],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "GetLiveContext",
            "description": "Provides real-time information about the devices",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]
ANSWER = {
    "type": "object",
    "properties": {"response": {"type": "string"}},
    "required": ["response"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "reply", "strict": True, "schema": ANSWER}}
TURN: list[Any] = [
    {"role": "system", "content": "You are a voice assistant for a home. Answer briefly."},
    {"role": "user", "content": "Turn on the kitchen light."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "HassTurnOn", "arguments": '{"name": "kitchen light"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"success": true}'},
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    need(*NEEDED)
    tmp = tmp_path_factory.mktemp("clients")
    with run_daemon(stack_config(tmp / "data"), tmp) as daemon:
        daemon.wait_loaded("chat")
        yield daemon


def _valid_answer_or_call(content: str | None, calls: list[tuple[str, str]]) -> None:
    """Either a well-formed call of one of the tools, or JSON content of the schema."""
    if calls:
        for name, arguments in calls:
            assert name in {t["function"]["name"] for t in HA_TOOLS}
            assert isinstance(json.loads(arguments), dict)
        return
    obj = json.loads(content or "")
    assert set(obj) == {"response"} and isinstance(obj["response"], str)


def test_home_assistant_llama_cpp_validation_and_turn(stack: Daemon) -> None:
    client = stack.openai()
    # The integration checks the server with a tiny call carrying tools.
    probe = client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "Hi"}],
        tools=HA_TOOLS,
        max_tokens=3,
    )
    assert len(probe.choices) == 1 and probe.usage is not None
    assert probe.usage.completion_tokens <= 3
    # A turn after a tool call: tools, the tool's result, a strict json_schema format.
    turn = client.chat.completions.create(
        model="chat",
        messages=TURN,
        tools=HA_TOOLS,
        response_format=FORMAT,
        max_tokens=96,
        temperature=0,
    )
    (choice,) = turn.choices
    assert choice.finish_reason in ("stop", "tool_calls")
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    _valid_answer_or_call(choice.message.content, calls)
    # The same turn streamed, with the usage chunk the integration asks for.
    stream = client.chat.completions.create(
        model="chat",
        messages=TURN,
        tools=HA_TOOLS,
        response_format=FORMAT,
        max_tokens=96,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    content = "".join(d.content or "" for d in deltas)
    streamed = [
        (t.function.name or "", t.function.arguments or "")
        for d in deltas
        for t in d.tool_calls or []
    ]
    _valid_answer_or_call(content, streamed)
    assert (content or None, streamed) == (choice.message.content, calls)  # same at temperature 0


def test_forced_tool_call_is_well_formed(stack: Daemon) -> None:
    out = stack.openai().chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "Turn on the kitchen light."}],
        tools=HA_TOOLS,
        tool_choice={"type": "function", "function": {"name": "HassTurnOn"}},
        max_tokens=64,
        temperature=0,
        presence_penalty=1.0,  # without it the 135M model repeats itself inside the call
    )
    (call,) = out.choices[0].message.tool_calls or []
    assert call.function.name == "HassTurnOn"
    args = json.loads(call.function.arguments)
    assert isinstance(args, dict) and set(args) <= {"name", "area", "domain"}


def test_ollama_client_on_the_real_stack(stack: Daemon) -> None:
    with ollama.Client(host=stack.url) as client:
        shaped = client.chat(
            model="chat",
            messages=[{"role": "user", "content": "What colour is the sky? Answer in one word."}],
            format=ANSWER,
            options={"temperature": 0, "num_predict": 48},
        )
        assert set(json.loads(shaped.message.content)) == {"response"}
        assert shaped.eval_count and shaped.prompt_eval_count
        parts = list(
            client.generate(
                model="gemma3", prompt="The sky is", options={"num_predict": 6}, stream=True
            )
        )
        assert parts[-1].done and "".join(p.response for p in parts).strip()
        vectors = client.embed(model="minilm", input=["a cat", "a kitten"]).embeddings
        assert len(vectors) == 2 and len(vectors[0]) == 384
        loaded = {m.model: m for m in client.ps().models}
        assert "smollm2" in loaded and "chat" not in loaded  # one entry per service
        assert loaded["smollm2"].size and loaded["smollm2"].expires_at


@pytest.mark.parametrize("stream", [False, True])
def test_a_schema_the_grammar_cannot_take_is_a_400(stack: Daemon, stream: bool) -> None:
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"properties": {"a": 5}}}}
    with pytest.raises(openai.BadRequestError) as err:
        stack.openai().chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "Hi"}],
            response_format=bad,  # type: ignore[arg-type]
            max_tokens=4,
            stream=stream,
        )
    assert err.value.body["param"] == "response_format"  # type: ignore[index]


def test_n_choices_and_a_streamed_n_refused_by_name(stack: Daemon) -> None:
    client = stack.openai()
    msgs: list[Any] = [{"role": "user", "content": "Hi"}]
    two = client.chat.completions.create(model="chat", messages=msgs, n=2, max_tokens=4)
    assert [c.index for c in two.choices] == [0, 1]
    assert two.usage is not None and two.usage.completion_tokens <= 8
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="chat", messages=msgs, n=2, max_tokens=4, stream=True)
    assert err.value.body["param"] == "n"  # type: ignore[index]
