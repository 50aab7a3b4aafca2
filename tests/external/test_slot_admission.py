"""The real llama-server and the packaged SmolLM2 GGUF: a server started with ``-np
{parallel}`` gives a request one slot of its context, so the daemon admits against one
slot (a longer request is a 413 naming the slot, not an answer cut short); a request the
server cannot pause (log probabilities) is not marked pausable, and a pause asked of it
is refused while its stream runs to its end."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import openai
import pytest
from tests.external.llama_server import llama_config, llama_server_path, smollm2
from tests.external.test_llama_park import _backend, _request, _text, _whole
from tests.live.support import live, run

from accelmux.errors import BackendError

pytestmark = [pytest.mark.real, pytest.mark.slow]
PROMPT = "Once upon a time"


def _config() -> dict[str, Any]:
    config = llama_config(llama_server_path(), smollm2())
    backend = config["services"]["chat"]["backend"]
    backend["argv"] = [a if a != "{ctx_size}" else "{ctx_total}" for a in backend["argv"]]
    backend["park"] = "llama-server"
    backend["argv"] += ["--slot-save-path", "{slot_save_path}"]
    return config


def test_a_request_longer_than_one_slot_is_refused_naming_it(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(_config(), tmp=tmp_path) as lv, lv.openai(timeout=120) as client:
            status = next(s for s in lv.runtime.status()["services"] if s["name"] == "chat")
            assert status["capabilities"]["kv_per_slot"] and status["concurrency"] == 2
            per_token = lv.runtime.manager.world.services["chat"].spec.profile.kv_bytes_per_token
            slot_tokens = status["kv_ceiling_bytes"] // 2 // per_token
            with pytest.raises(openai.APIStatusError) as caught:
                await client.completions.create(
                    model="chat", prompt=PROMPT, max_tokens=slot_tokens + 16, temperature=0
                )
            assert caught.value.status_code == 413
            assert "one of its 2 slots" in str(caught.value.message)
            ok = await client.completions.create(
                model="chat", prompt=PROMPT, max_tokens=8, temperature=0
            )
            assert ok.choices[0].text and ok.usage is not None
            assert ok.usage.completion_tokens == 8  # not cut short

    run(body())


def test_a_request_the_server_cannot_pause_is_refused_a_pause_and_runs_on(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        backend = _backend(tmp_path)
        await backend.load(weights_bytes=90 << 20, runtime_bytes=0, kv_pool_bytes=0)
        try:
            plain = _request("p1", max_tokens=6)
            with_logprobs = replace(
                _request("l1", max_tokens=12), body={**plain.body, "max_tokens": 12, "logprobs": 2}
            )
            assert backend.can_pause(plain)
            assert not backend.can_pause(with_logprobs)
            answer = await backend.handle(with_logprobs)
            assert answer.stream is not None
            chunks = [await anext(answer.stream)]
            with pytest.raises(BackendError, match="cannot be paused: it names logprobs"):
                await backend.pause("l1", park=True)
            chunks += [chunk async for chunk in answer.stream]  # it ran on to its end
            assert b"data: [DONE]" in b"".join(chunks)
            assert _text(await _whole(backend, plain))
        finally:
            await backend.close()

    run(body())
