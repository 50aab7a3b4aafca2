"""Paused streams over an unload of their model: what is kept, and the cost of going on.

Two parts, each repeated ``--repeat`` times (medians are reported):

* ``sequences``: SmolLM2 in this process (``LlamaTextModel``, a 2,048-token context): a
  sampled stream with a prompt of about N tokens generates 8 tokens and is parked; the
  model unloads (the stream's state stays in host memory: ``kept_bytes``) and loads
  again; the resume restores the saved cells into the new context (``restore_s``),
  against evaluating the same tokens again on that context (``recompute_s``: what a
  stream that did not survive would cost, its prompt again); the resumed stream is
  checked token for token against an unpaused one. A JSON-schema stream (its grammar
  sampler is grown again on the reloaded model) is checked the same way.
* ``worker``: through ``WorkerBackend`` and a real worker process: ``pause(park=True)``,
  ``unload(tier=parked)``, ``load``, ``resume``: each round trip, and from the resume to
  the next chunk.

    .venv/bin/python bench/bench_pause_unload.py   # writes bench/results/pause_unload.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from bench_pause import PROMPT_WORDS, SAMPLED, median, messages, new_backend, request  # noqa: E402
from meta import run_meta  # noqa: E402

from accelmux.core.types import Tier  # noqa: E402
from accelmux.models import LlamaTextModel  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "pause_unload.json"
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


# ---- sequences (in this process) ----------------------------------------------------------
def over_unload(model: LlamaTextModel, prompt: list[dict[str, str]], **kw: Any) -> dict[str, Any]:
    """One paused stream over an unload and a load."""
    list(model.chat_stream(prompt, **kw))  # the reference starts from the cached prompt
    ref = list(model.chat_stream(prompt, **kw))
    stream = model.chat_stream(prompt, **kw)
    got = [next(stream) for _ in range(8)]
    stream.pause(park=True)
    tokens = stream.saved.n_tokens if stream.saved is not None else 0
    t = time.perf_counter()
    model.unload()
    unload_s = time.perf_counter() - t
    kept = stream.parked_bytes
    t = time.perf_counter()
    model.load()
    load_s = time.perf_counter() - t
    resumed = stream.resume()
    got += list(stream)
    # what the restore saves: the same tokens evaluated again on the reloaded context
    llm = model._llm
    ids = [int(i) for i in llm.input_ids[:tokens]]
    llm._ctx.kv_cache_seq_rm(-1, 0, -1)
    llm.n_tokens = 0
    t = time.perf_counter()
    llm.eval(ids)
    recompute_s = time.perf_counter() - t
    llm._ctx.kv_cache_seq_rm(-1, 0, -1)
    llm.n_tokens = 0
    return {
        "tokens": tokens,
        "kept_bytes": kept,
        "unload_s": unload_s,
        "load_s": load_s,
        "restore_s": resumed.seconds,
        "restored": resumed.restored,
        "recompute_s": recompute_s,
        "identical": got == ref,
    }


def sequences(repeat: int) -> list[dict[str, Any]]:
    model = LlamaTextModel.smollm2(n_ctx=2048)
    model.load()
    cases: list[tuple[str, list[dict[str, str]], dict[str, Any]]] = [
        (f"{words} words", messages(words), {**SAMPLED, "max_tokens": 16}) for words in PROMPT_WORDS
    ]
    cat = [{"role": "user", "content": "Describe a cat as JSON."}]
    cases.append(("JSON schema", cat, {**SAMPLED, "max_tokens": 24, "schema": SCHEMA}))
    out = []
    try:
        for name, prompt, kw in cases:
            runs = [over_unload(model, prompt, **kw) for _ in range(repeat)]
            row: dict[str, Any] = {"case": name, "schema": "schema" in kw}
            row["tokens"] = int(statistics.median(r["tokens"] for r in runs))
            row["kept_bytes"] = int(statistics.median(r["kept_bytes"] for r in runs))
            for key in ("unload_s", "load_s", "restore_s", "recompute_s"):
                row[key] = median([r[key] for r in runs])
            row["restored"] = all(r["restored"] for r in runs)
            row["identical"] = all(r["identical"] for r in runs)
            print(f"sequence {row}", flush=True)
            out.append(row)
    finally:
        model.unload()
    return out


# ---- the worker ---------------------------------------------------------------------------
async def worker_round_trips(data_dir: Path, repeat: int) -> dict[str, Any]:
    backend = await new_backend(data_dir, "smollm2")
    await backend.load(weights_bytes=0, runtime_bytes=0, kv_pool_bytes=0)
    steps = ("park", "unload", "load", "resume", "resume_to_chunk")
    times: dict[str, list[float]] = {k: [] for k in steps}
    kept: list[int] = []
    try:
        for i in range(repeat):
            rid = f"r{i}"
            response = await backend.handle(request(rid))
            assert response.stream is not None
            chunks = response.stream.__aiter__()
            for _ in range(4):
                await chunks.__anext__()
            t = time.perf_counter()
            await backend.pause(rid, park=True)
            times["park"].append(time.perf_counter() - t)
            received: list[float] = []

            async def consume(chunks: Any = chunks, received: list[float] = received) -> None:
                async for _ in chunks:
                    received.append(time.perf_counter())

            consumer = asyncio.ensure_future(consume())
            t = time.perf_counter()
            await backend.unload(tier=Tier.PARKED)
            times["unload"].append(time.perf_counter() - t)
            header, _ = await backend.client.call({"op": "memory"}, timeout=10)
            kept.append(int(header["parked_streams_bytes"]))
            await asyncio.sleep(0.2)  # what was sent before the pause took arrives
            before = len(received)
            t = time.perf_counter()
            await backend.load(weights_bytes=0, runtime_bytes=0, kv_pool_bytes=0)
            times["load"].append(time.perf_counter() - t)
            t = time.perf_counter()
            await backend.resume(rid)
            times["resume"].append(time.perf_counter() - t)
            await consumer
            if len(received) > before:
                times["resume_to_chunk"].append(received[before] - t)
    finally:
        await backend.unload()
        await backend.close()
    result: dict[str, Any] = {k: median(v) for k, v in times.items() if v}
    result["kept_bytes"] = int(statistics.median(kept))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    t0 = time.monotonic()
    seqs = sequences(args.repeat)
    with tempfile.TemporaryDirectory() as tmp:
        worker = asyncio.run(worker_round_trips(Path(tmp), args.repeat))
    print(f"worker {worker}", flush=True)
    settings = {
        "repeat": args.repeat,
        "prompt_words": list(PROMPT_WORDS),
        "sampling": SAMPLED,
        "wall_s": round(time.monotonic() - t0, 1),
    }
    report = {"meta": run_meta(settings), "sequences": seqs, "worker": worker}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
