"""Time sharing through the daemon with the real inference worker: a stream of one model
is paused for another model's first token, and its model is unloaded only once the
worker confirmed the pause (``PauseFinished``); the paused stream then resumes and ends
whole."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from tests.live.support import live, run

from accelmux.core.actions import Pause, Unload
from accelmux.core.events import PauseFinished

from .support import GEMMA3, LLAMA, SMOLLM2, need

pytestmark = pytest.mark.real


def _llm(kind: str, model: str) -> dict[str, Any]:
    return {
        "kind": kind,
        "class": "interactive",
        "residency": "warm",
        "memory": {
            "weights": "700MiB",
            "kv_per_token": "32KiB",
            "kv_floor": "16MiB",
            "kv_ceiling": "32MiB",
            "workspace": "16MiB",
        },
        "backend": {"type": "worker", "options": {"model": model, "n_threads": 1}},
    }


def test_a_model_is_unloaded_for_another_only_after_its_stream_is_confirmed_paused(
    tmp_path: Path,
) -> None:
    need(LLAMA, SMOLLM2, GEMMA3)
    config = {
        # Room for one of the two models only: the second's first token needs the first's
        # stream paused and its model unloaded.
        "devices": {"cpu": {"kind": "virtual", "capacity": "1GiB", "headroom": "64MiB"}},
        "services": {"chat": _llm("chat", "smollm2"), "completion": _llm("completion", "gemma3")},
        "host": {"park_budget": "1GiB"},
        "server": {"drain_s": 2.0},
    }

    async def body() -> None:
        async with live(config, tmp=tmp_path) as lv, lv.openai(timeout=300) as client:
            manager = lv.runtime.manager
            seen: list[Any] = []
            handle = manager.handle

            def recording(event: Any, now: float) -> Any:
                out = handle(event, now)
                seen.append(event)
                seen.extend(out)
                return out

            manager.handle = recording  # type: ignore[method-assign]
            story = await client.chat.completions.create(
                model="chat",
                messages=[{"role": "user", "content": "Tell me a long story about a cat."}],
                max_tokens=300,
                temperature=0,
                stream=True,
            )
            pieces: list[str] = []

            async def read() -> None:
                async for chunk in story:
                    if chunk.choices:
                        pieces.append(chunk.choices[0].delta.content or "")

            reader = asyncio.create_task(read())
            while len(pieces) < 3:
                await asyncio.sleep(0.02)
            # The request waits until the stream ran long enough to be time-shared (the
            # Manager wakes itself for that moment), then pauses it.
            other = await client.completions.create(
                model="completion", prompt="Once upon a time", max_tokens=8, temperature=0
            )
            await asyncio.wait_for(reader, 240)
        assert other.choices[0].text
        assert "".join(pieces)
        pause = next(a for a in seen if isinstance(a, Pause) and a.service == "chat")
        at = seen.index(pause)
        ack = next(
            i
            for i, e in enumerate(seen)
            if isinstance(e, PauseFinished) and e.request_id == pause.request_id
        )
        unload = next(
            i for i, a in enumerate(seen) if isinstance(a, Unload) and a.service == "chat"
        )
        assert at < ack < unload  # the model went only once the pause was confirmed

    run(body())
