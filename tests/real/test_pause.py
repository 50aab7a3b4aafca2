"""Pausing, parking and resuming a llama.cpp stream between tokens (real models).

Every comparison samples (temperature > 0, a seed): a resumed stream must draw the very
tokens an unpaused one draws. A reference is the second of two unpaused runs, so that it
starts from the same cached prompt as the paused run after it (llama-cpp-python reuses
the cells of a matching prompt prefix, and Gemma 3's sliding-window cache then samples
from slightly different logits than a fresh evaluation does).
"""

from __future__ import annotations

import pytest

from accelmux.errors import BackendError
from accelmux.models import LlamaTextModel, TextStream, llama_samplers

from .support import LLAMA, SMOLLM2, need

pytestmark = pytest.mark.real

STORY = [{"role": "user", "content": "Tell me a short story about a cat."}]
RIVERS = [{"role": "user", "content": "Name three rivers."}]
SAMPLED = {"max_tokens": 24, "temperature": 0.9, "top_p": 0.95, "seed": 7}


def reference(model: LlamaTextModel, messages: list[dict[str, str]]) -> list[str]:
    list(model.chat_stream(messages, **SAMPLED))
    return list(model.chat_stream(messages, **SAMPLED))


def take(stream: TextStream, n: int) -> list[str]:
    return [next(stream) for _ in range(n)]


def test_a_paused_stream_resumes_token_for_token(smollm2: LlamaTextModel) -> None:
    ref = reference(smollm2, STORY)
    assert len(ref) > 8
    stream = smollm2.chat_stream(STORY, **SAMPLED)
    out = take(stream, 5)
    paused = stream.pause()
    assert paused.state == "paused" and paused.parked_bytes == 0  # its cells stay put
    with pytest.raises(BackendError, match="paused"):
        next(stream)
    resumed = stream.resume()
    assert resumed.state == "running" and not resumed.restored and not resumed.recomputed
    out += list(stream)
    assert out == ref
    assert stream.pause().state == "ended"  # pausing a finished stream is no error
    assert stream.resume().state == "ended"


def test_park_lets_other_requests_run_then_resumes_identically(smollm2: LlamaTextModel) -> None:
    rivers = smollm2.chat(RIVERS, **SAMPLED).text
    ref = reference(smollm2, STORY)
    stream = smollm2.chat_stream(STORY, **SAMPLED)
    out = take(stream, 6)
    parked = stream.pause(park=True)
    assert parked.state == "paused"
    # the sequence is off the context: prompt + 6 tokens of KV (~23 KiB per token)
    assert parked.parked_bytes == stream.parked_bytes > 20 * 2**10 * 20
    assert smollm2.chat(RIVERS, **SAMPLED).text == rivers  # another request, same model
    assert "".join(smollm2.chat_stream(RIVERS, **SAMPLED)) == rivers
    resumed = stream.resume()
    assert resumed.restored and not resumed.recomputed
    assert resumed.parked_bytes == parked.parked_bytes and stream.parked_bytes == 0
    out += list(stream)
    assert out == ref


def test_an_unparked_pause_is_saved_by_the_next_request(smollm2: LlamaTextModel) -> None:
    ref = reference(smollm2, STORY)
    stream = smollm2.chat_stream(STORY, **SAMPLED)
    out = take(stream, 3)
    stream.pause()
    assert stream.parked_bytes == 0
    smollm2.complete("One, two, three,", max_tokens=4, temperature=0)
    assert stream.parked_bytes > 0  # saved before the call touched the cells
    assert stream.resume().restored
    out += list(stream)
    assert out == ref


def test_a_running_stream_keeps_the_model_a_paused_one_does_not(smollm2: LlamaTextModel) -> None:
    first = smollm2.chat_stream(STORY, **SAMPLED)
    second = smollm2.chat_stream(RIVERS, **SAMPLED)
    next(first)
    with pytest.raises(BackendError, match="busy"):
        next(second)
    first.pause(park=True)
    assert list(second)
    second.close()
    first.resume()
    with pytest.raises(BackendError, match="busy"):
        smollm2.chat(RIVERS, max_tokens=2)
    first.close()
    assert smollm2.chat(RIVERS, max_tokens=2, temperature=0).text


def test_a_paused_stream_survives_a_resize(smollm2: LlamaTextModel) -> None:
    ref = reference(smollm2, STORY)
    old = smollm2.n_ctx
    stream = smollm2.chat_stream(STORY, **SAMPLED)
    out = take(stream, 4)
    stream.pause()
    try:
        assert not smollm2.resize_context(old * 2).reloaded_weights
        assert stream.parked_bytes > 0  # saved before the old context went away
        assert stream.resume().restored
        out += list(stream)
    finally:
        smollm2.resize_context(old)
    assert out == ref


def test_greedy_and_base_model_streams_resume_too(gemma3: LlamaTextModel) -> None:
    prompt = "Once upon a time, in a small village by the sea, there lived"
    kwargs = {"max_tokens": 16, "temperature": 0.8, "seed": 3}
    list(gemma3.complete_stream(prompt, **kwargs))
    ref = list(gemma3.complete_stream(prompt, **kwargs))
    stream = gemma3.complete_stream(prompt, **kwargs)
    out = take(stream, 4)
    assert stream.pause(park=True).parked_bytes > 0
    assert gemma3.complete("The largest rivers of Europe are", max_tokens=6, temperature=0).text
    assert stream.resume().restored
    out += list(stream)
    assert out == ref


def test_a_running_stream_keeps_its_model_loaded() -> None:
    need(LLAMA, SMOLLM2)
    model = LlamaTextModel.smollm2(n_ctx=256, n_threads=1)
    model.load()
    stream = model.chat_stream(STORY, **SAMPLED)
    next(stream)
    with pytest.raises(BackendError, match="busy"):
        model.unload()
    stream.close()
    model.unload()
    assert model.kept_streams == 0 and not model.loaded


@pytest.mark.parametrize("park", [True, False], ids=["parked", "unparked"])
def test_a_paused_stream_survives_an_unload_and_the_next_load(park: bool) -> None:
    """Paused (parked, or only paused: the unload saves it), unloaded, loaded again into
    a context of another size, another stream run in between: it resumes token for
    token. A resume before the load is refused and leaves it paused."""
    need(LLAMA, SMOLLM2)
    model = LlamaTextModel.smollm2(n_ctx=512, n_threads=1)
    model.load()
    ref = reference(model, STORY)
    stream = model.chat_stream(STORY, **SAMPLED)
    out = take(stream, 5)
    stream.pause(park=park)
    model.unload()
    assert not model.loaded and model.kept_streams == 1
    kept = stream.parked_bytes
    assert kept > 20 * 2**10 * 20  # its cells and tokens stay in host memory
    with pytest.raises(BackendError, match="not loaded: a paused stream resumes once it loads"):
        stream.resume()
    with pytest.raises(BackendError, match="paused"):
        next(stream)
    assert stream.state == "paused" and stream.parked_bytes == kept
    model.resize_context(1024)  # the next load makes a bigger context
    model.load()
    assert model.n_ctx == 1024 and model.kept_streams == 0
    assert "".join(model.chat_stream(RIVERS, **SAMPLED))  # the reloaded model serves others
    resumed = stream.resume()
    assert resumed.restored and not resumed.recomputed and resumed.parked_bytes == kept
    out += list(stream)
    assert out == ref
    model.unload()


def test_a_json_schema_stream_survives_an_unload() -> None:
    """Its grammar sampler points into the model's vocabulary: it is freed with the
    model and grown again on the next load, fed the tokens sampled so far; the rest of
    the chain (the seeded RNG) is the same object."""
    need(LLAMA, SMOLLM2)
    model = LlamaTextModel.smollm2(n_ctx=512, n_threads=1)
    model.load()
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    cat = [{"role": "user", "content": "Describe a cat as JSON."}]
    kwargs = {**SAMPLED, "max_tokens": 32, "schema": schema}
    list(model.chat_stream(cat, **kwargs))
    ref = list(model.chat_stream(cat, **kwargs))
    stream = model.chat_stream(cat, **kwargs)
    out = take(stream, 5)
    stream.pause(park=True)
    model.unload()
    assert model.kept_streams == 1
    model.load()
    assert "".join(model.chat_stream(RIVERS, **kwargs)).startswith("{")  # another grammar
    assert stream.resume().restored
    out += list(stream)
    assert out == ref
    model.unload()


def test_a_sampler_that_cannot_outlive_its_model_ends_at_the_unload(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sampler not known to keep to itself (here ``dist``, as if it pointed into the
    model) ends its stream at the unload, saying why; a greedy stream beside it stays."""
    need(LLAMA, SMOLLM2)
    monkeypatch.setattr(llama_samplers, "SELF_CONTAINED", llama_samplers.SELF_CONTAINED - {"dist"})
    model = LlamaTextModel.smollm2(n_ctx=512, n_threads=1)
    model.load()
    sampled = model.chat_stream(STORY, **SAMPLED)
    assert take(sampled, 2)
    sampled.pause(park=True)
    greedy = model.chat_stream(STORY, **{**SAMPLED, "temperature": 0.0})
    assert take(greedy, 2)
    greedy.pause()
    model.unload()
    assert sampled.state == "ended" and greedy.state == "paused"
    assert model.kept_streams == 1
    with pytest.raises(BackendError, match=r"its sampler \(dist\) refers to the unloaded model"):
        next(sampled)
    assert sampled.resume().state == "ended"
    model.load()
    assert greedy.resume().restored
    assert list(greedy)
    model.unload()


def test_a_base_model_stream_survives_an_unload(gemma3: LlamaTextModel) -> None:
    """Gemma 3 (its sliding-window cache included), restored into a fresh context."""
    prompt = "Once upon a time, in a small village by the sea, there lived"
    kwargs = {"max_tokens": 12, "temperature": 0.8, "seed": 5}
    list(gemma3.complete_stream(prompt, **kwargs))
    ref = list(gemma3.complete_stream(prompt, **kwargs))
    stream = gemma3.complete_stream(prompt, **kwargs)
    out = take(stream, 4)
    stream.pause(park=True)
    gemma3.unload()
    try:
        gemma3.load()
        assert stream.resume().restored
        out += list(stream)
    finally:
        gemma3.load()
    assert out == ref
