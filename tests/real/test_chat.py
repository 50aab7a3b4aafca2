"""Chat and completion through llama.cpp with the packaged SmolLM2 and Gemma 3 GGUF files."""

from __future__ import annotations

import json

import pytest

from accelmux.errors import BackendError, RequestError
from accelmux.models import LlamaTextModel

from .support import LLAMA, SMOLLM2, need

pytestmark = pytest.mark.real

FRUITS = [{"role": "user", "content": "Name three fruits."}]


def test_chat_replies_with_text(smollm2: LlamaTextModel) -> None:
    out = smollm2.chat(FRUITS, max_tokens=32, temperature=0)
    assert out.text.strip()
    assert out.prompt_tokens == smollm2.count_chat_tokens(FRUITS)
    assert 0 < out.completion_tokens <= 32
    assert out.finish_reason in ("stop", "length")


def test_chat_stream_yields_several_deltas_that_make_the_reply(smollm2: LlamaTextModel) -> None:
    whole = smollm2.chat(FRUITS, max_tokens=24, temperature=0).text
    chunks = list(smollm2.chat_stream(FRUITS, max_tokens=24, temperature=0))
    assert len(chunks) > 1
    assert all(chunks)
    assert "".join(chunks) == whole


def test_chat_template_is_applied(smollm2: LlamaTextModel) -> None:
    prompt = smollm2.format_chat(FRUITS)
    assert "<|im_start|>user\nName three fruits.<|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_completion_and_streaming_on_a_base_model(gemma3: LlamaTextModel) -> None:
    out = gemma3.complete("The capital of France is", max_tokens=12, temperature=0)
    assert out.text.strip()
    assert out.prompt_tokens == gemma3.count_tokens("The capital of France is")
    chunks = list(gemma3.complete_stream("Once upon a time", max_tokens=12, temperature=0))
    assert len(chunks) > 1
    assert "".join(chunks).strip()


def test_base_model_has_no_chat(gemma3: LlamaTextModel) -> None:
    assert not gemma3.has_chat_template
    with pytest.raises(RequestError, match="without a chat template"):
        gemma3.chat(FRUITS)


def test_token_counting_and_context_too_large(smollm2: LlamaTextModel) -> None:
    assert smollm2.count_tokens("hello world") == len(smollm2.tokenize("hello world")) > 0
    long_text = "apple " * 2000
    assert smollm2.count_tokens(long_text) > smollm2.n_ctx
    with pytest.raises(RequestError, match="context holds") as err:
        smollm2.chat([{"role": "user", "content": long_text}], max_tokens=4)
    assert err.value.field == "messages"
    with pytest.raises(RequestError, match="context holds"):
        smollm2.complete(long_text, max_tokens=4)


@pytest.mark.parametrize(
    "messages",
    [[], [{"role": "robot", "content": "x"}], [{"role": "user", "content": 3}], "hello"],
)
def test_malformed_messages_are_request_errors(smollm2: LlamaTextModel, messages: object) -> None:
    with pytest.raises(RequestError):
        smollm2.chat(messages, max_tokens=4)  # type: ignore[arg-type]


def test_streams_do_not_interleave(smollm2: LlamaTextModel) -> None:
    stream = smollm2.chat_stream(FRUITS, max_tokens=8, temperature=0)
    next(stream)
    with pytest.raises(BackendError, match="busy"):
        smollm2.chat(FRUITS, max_tokens=4)
    with pytest.raises(BackendError, match="busy"):
        smollm2.unload()
    stream.close()
    assert smollm2.chat(FRUITS, max_tokens=4, temperature=0).text


def test_resize_keeps_the_weights() -> None:
    need(LLAMA, SMOLLM2)
    model = LlamaTextModel.smollm2(n_ctx=512)
    model.load()
    try:
        llm = model._llm
        weights_object, weights_pointer = llm._model, llm.model
        before = model.chat(FRUITS, max_tokens=24, temperature=0).text
        long_prompt = "apple " * 530
        with pytest.raises(RequestError):
            model.complete(long_prompt, max_tokens=4)

        grown = model.resize_context(2048)
        assert not grown.reloaded_weights, grown.reason
        assert (grown.old_n_ctx, grown.new_n_ctx, model.n_ctx) == (512, 2048, 2048)
        assert model._llm is llm
        assert llm._model is weights_object
        assert llm.model == weights_pointer  # the same llama_model in C
        # the bigger pool serves what did not fit, and the output is unchanged
        assert model.complete(long_prompt, max_tokens=4, temperature=0).prompt_tokens > 512
        assert model.chat(FRUITS, max_tokens=24, temperature=0).text == before

        shrunk = model.resize_context(300)  # padded to llama.cpp's 256-cell steps
        assert not shrunk.reloaded_weights
        assert model.n_ctx == 512
        assert llm._model is weights_object
        assert model.chat(FRUITS, max_tokens=24, temperature=0).text == before
    finally:
        model.unload()
    assert not model.loaded


def test_resize_when_unloaded_changes_the_configured_size() -> None:
    need(SMOLLM2)
    model = LlamaTextModel.smollm2(n_ctx=1024)
    result = model.resize_context(4000)
    assert model.n_ctx == 4096
    assert not result.reloaded_weights
    assert model.memory_estimate() > LlamaTextModel.smollm2(n_ctx=1024).memory_estimate()


def test_resize_falls_back_to_a_reload_without_the_internals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    need(LLAMA, SMOLLM2)
    from accelmux.models import llama_adapter

    def no_swap(llm: object, n_ctx: int, n_batch: int, n_ubatch: int) -> None:
        raise AttributeError("_ctx")

    model = LlamaTextModel.smollm2(n_ctx=512)
    model.load()
    try:
        monkeypatch.setattr(llama_adapter, "swap_context", no_swap)
        result = model.resize_context(1024)
        assert result.reloaded_weights
        assert "reloaded" in result.reason
        assert model.n_ctx == 1024
        assert model.chat(FRUITS, max_tokens=8, temperature=0).text
    finally:
        model.unload()


COLOUR = [{"role": "user", "content": "What colour is the sky? Answer in one word."}]
ANSWER = {
    "type": "object",
    "properties": {"response": {"type": "string"}, "sure": {"type": "boolean"}},
    "required": ["response", "sure"],
    "additionalProperties": False,
}


def test_a_schema_holds_the_output_to_json_of_that_schema(smollm2: LlamaTextModel) -> None:
    free = smollm2.chat(COLOUR, max_tokens=24, temperature=0).text
    held = smollm2.chat(COLOUR, max_tokens=64, temperature=0, schema=ANSWER)
    obj = json.loads(held.text)  # without the grammar the reply is prose
    assert set(obj) == {"response", "sure"} and isinstance(obj["sure"], bool)
    assert not free.lstrip().startswith("{")
    streamed = "".join(smollm2.chat_stream(COLOUR, max_tokens=64, temperature=0, schema=ANSWER))
    assert streamed == held.text


def test_a_schema_the_grammar_cannot_take_is_a_request_error(smollm2: LlamaTextModel) -> None:
    with pytest.raises(RequestError) as err:
        smollm2.chat(COLOUR, max_tokens=4, schema={"type": "object", "properties": {"x": 5}})
    assert err.value.field == "response_format"


def test_penalties_reach_the_sampler_and_unknown_ones_are_refused(
    smollm2: LlamaTextModel,
) -> None:
    plain = smollm2.chat(FRUITS, max_tokens=24, temperature=0).text
    penalised = smollm2.chat(
        FRUITS, max_tokens=24, temperature=0, penalties={"repeat_penalty": 1.5}
    ).text
    assert penalised != plain
    with pytest.raises(RequestError):
        smollm2.chat(FRUITS, max_tokens=4, penalties={"mirostat": 2.0})
