"""Pause, park and resume of a llama.cpp stream, and cold vs parked loads, measured.

Three parts, each repeated ``--repeat`` times (medians are reported):

* ``sequences``: SmolLM2 in this process (``LlamaTextModel``, 2,048-token context): a
  sampled stream with a prompt of about N tokens generates 8 tokens, then its pause,
  park (save: seconds and bytes), and resume after another request used the context
  (restore), against evaluating the same tokens again (what the restore saves); the
  resumed stream is checked token for token against an unpaused one.
* ``worker``: through ``WorkerBackend`` and a real worker process: the round trip of a
  pause (it waits for the next token), of a parked pause, of a resume, and from the
  resume to the next chunk.
* ``loads`` (``--load-repeat`` times): each packaged GGUF loaded by a worker after a
  cold unload with the file dropped from the page cache (``posix_fadvise(DONTNEED)``;
  the resident share before the load is recorded, since pages another process maps
  cannot be dropped), after a cold unload with the file still in the page cache, and
  after ``unload(tier=parked)``;
  ``load_s`` is the worker's load, ``first_token_s`` the first request after it (with an
  mmap'd GGUF, pages a load did not touch are read then).

    .venv/bin/python bench/bench_pause.py      # writes bench/results/pause.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from meta import run_meta  # noqa: E402

from accelmux.backends.base import BackendRequest  # noqa: E402
from accelmux.backends.worker import WorkerBackend, WorkerPool  # noqa: E402
from accelmux.config.backends import WorkerBackendConfig  # noqa: E402
from accelmux.core.types import ServiceKind, Tier  # noqa: E402
from accelmux.models import LlamaTextModel  # noqa: E402
from accelmux.models.assets import gemma3_gguf_path, smollm2_gguf_path  # noqa: E402
from accelmux.worker.parked import Mapping  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "pause.json"
SAMPLED = {"temperature": 0.9, "top_p": 0.95, "seed": 11}
PROMPT_WORDS = (30, 300, 1200)  # "word " repeated: about one token each
FILLER = "Summarise in one line: " + "the quick brown fox jumps over the lazy dog " * 200


def median(xs: list[float]) -> float:
    return round(statistics.median(xs), 6)


def messages(words: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": " ".join(FILLER.split()[:words])}]


# ---- sequences (in this process) ----------------------------------------------------------
def sequences(repeat: int) -> list[dict[str, Any]]:
    model = LlamaTextModel.smollm2(n_ctx=2048)
    model.load()
    llm = model._llm
    out = []
    try:
        for words in PROMPT_WORDS:
            prompt = messages(words)
            kw = {**SAMPLED, "max_tokens": 16}
            pause_s, save_s, restore_s, recompute_s, sizes, tokens = [], [], [], [], [], []
            identical = True
            for _ in range(repeat):
                # the reference starts from the cached prompt the paused run starts from
                list(model.chat_stream(prompt, **kw))
                ref = list(model.chat_stream(prompt, **kw))
                stream = model.chat_stream(prompt, **kw)
                got = [next(stream) for _ in range(8)]
                t = time.perf_counter()
                stream.pause()
                pause_s.append(time.perf_counter() - t)
                tokens.append(int(llm.n_tokens))
                parked = stream.pause(park=True)
                save_s.append(parked.seconds)
                sizes.append(parked.parked_bytes)
                model.complete("One, two,", max_tokens=2, temperature=0)  # uses the context
                resumed = stream.resume()
                restore_s.append(resumed.seconds)
                got += list(stream)
                identical = identical and got == ref
                # what the restore saves: the same tokens evaluated from an empty context
                ids = [int(t) for t in llm.input_ids[: tokens[-1]]]
                llm._ctx.kv_cache_seq_rm(-1, 0, -1)
                llm.n_tokens = 0
                t = time.perf_counter()
                llm.eval(ids)
                recompute_s.append(time.perf_counter() - t)
                llm._ctx.kv_cache_seq_rm(-1, 0, -1)
                llm.n_tokens = 0
            row = {
                "prompt_words": words,
                "tokens": int(statistics.median(tokens)),
                "pause_s": median(pause_s),
                "park_s": median(save_s),
                "parked_bytes": int(statistics.median(sizes)),
                "restore_s": median(restore_s),
                "recompute_s": median(recompute_s),
                "identical": identical,
            }
            print(f"sequence {row}", flush=True)
            out.append(row)
    finally:
        model.unload()
    return out


# ---- the worker ---------------------------------------------------------------------------
def request(rid: str, stream: bool = True, max_tokens: int = 48) -> BackendRequest:
    body = {"messages": messages(30), "stream": stream, "max_tokens": max_tokens, **SAMPLED}
    return BackendRequest(
        request_id=rid,
        service="chat",
        kind=ServiceKind.CHAT,
        endpoint="/v1/chat/completions",
        body=body,
        stream=stream,
    )


async def new_backend(data_dir: Path, model: str) -> WorkerBackend:
    pool = WorkerPool(data_dir)
    cfg = WorkerBackendConfig(type="worker", options={"model": model, "n_ctx": 1024})
    kind = ServiceKind.CHAT if model == "smollm2" else ServiceKind.COMPLETION
    return pool.backend("chat", kind, cfg)


async def worker_round_trips(data_dir: Path, repeat: int) -> dict[str, Any]:
    backend = await new_backend(data_dir, "smollm2")
    await backend.load(weights_bytes=0, runtime_bytes=0, kv_pool_bytes=0)
    times: dict[str, list[float]] = {"pause": [], "park": [], "resume": [], "resume_to_chunk": []}
    try:
        for i in range(repeat):
            for park in (False, True):
                response = await backend.handle(request(f"r{i}-{park}"))
                assert response.stream is not None
                chunks = response.stream.__aiter__()
                for _ in range(4):
                    await chunks.__anext__()
                t = time.perf_counter()
                await backend.pause(f"r{i}-{park}", park=park)
                times["park" if park else "pause"].append(time.perf_counter() - t)
                received: list[float] = []

                async def consume(chunks: Any = chunks, received: list[float] = received) -> None:
                    async for _ in chunks:
                        received.append(time.perf_counter())

                consumer = asyncio.ensure_future(consume())
                await asyncio.sleep(0.2)  # what was sent before the pause took arrives
                before = len(received)
                t = time.perf_counter()
                await backend.resume(f"r{i}-{park}")
                times["resume"].append(time.perf_counter() - t)
                await consumer
                if len(received) > before:
                    times["resume_to_chunk"].append(received[before] - t)
    finally:
        await backend.unload()
        await backend.close()
    return {k: median(v) for k, v in times.items() if v}


# ---- loads --------------------------------------------------------------------------------
def resident_share(path: Path) -> float:
    """Share of ``path`` in the page cache now (a mapping that only looks: mincore)."""
    mapping = Mapping(path, populate=False)
    try:
        return round(mapping.resident_bytes() / max(1, mapping.size), 4)
    finally:
        mapping.close()


def drop_from_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


async def first_token(backend: WorkerBackend, model: str) -> float:
    t = time.perf_counter()
    if model == "smollm2":
        await backend.handle(request("first", stream=False, max_tokens=1))
    else:
        body = {"prompt": "Hello", "max_tokens": 1, "temperature": 0}
        await backend.handle(
            BackendRequest(
                request_id="first",
                service="chat",
                kind=ServiceKind.COMPLETION,
                endpoint="/v1/completions",
                body=body,
            )
        )
    return time.perf_counter() - t


async def loads(data_dir: Path, repeat: int) -> list[dict[str, Any]]:
    out = []
    for model, path in (("smollm2", smollm2_gguf_path()), ("gemma3", gemma3_gguf_path())):
        backend = await new_backend(data_dir, model)
        rows: dict[str, dict[str, list[float]]] = {}
        try:
            await backend.load(weights_bytes=0, runtime_bytes=0, kv_pool_bytes=0)
            for _ in range(repeat):
                for how in ("cold_dropped", "cold_cached", "parked"):
                    await backend.unload(tier=Tier.PARKED if how == "parked" else Tier.COLD)
                    if how == "cold_dropped":
                        drop_from_cache(path)
                    share = resident_share(path)
                    t = time.perf_counter()
                    await backend.load(weights_bytes=0, runtime_bytes=0, kv_pool_bytes=0)
                    wall = time.perf_counter() - t
                    first = await first_token(backend, model)
                    row = rows.setdefault(
                        how, {"resident_before": [], "load_s": [], "wall_s": [], "first": []}
                    )
                    row["resident_before"].append(share)
                    row["load_s"].append(float(backend.last_load["load_seconds"]))
                    row["wall_s"].append(wall)
                    row["first"].append(first)
                    assert backend.last_load["from_parked"] == (how == "parked")
        finally:
            await backend.unload()
            await backend.close()
        for how, row in rows.items():
            result = {
                "model": model,
                "file_bytes": path.stat().st_size,
                "how": how,
                "resident_before": median(row["resident_before"]),
                "load_s": median(row["load_s"]),
                "load_wall_s": median(row["wall_s"]),
                "first_token_s": median(row["first"]),
            }
            print(f"load {result}", flush=True)
            out.append(result)
    return out


def filesystem(path: Path) -> str:
    best, kind = "", "unknown"
    with open("/proc/mounts", encoding="utf-8") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) > 2 and str(path).startswith(parts[1]) and len(parts[1]) > len(best):
                best, kind = parts[1], parts[2]
    return kind


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--load-repeat", type=int, default=7)
    args = parser.parse_args()
    t0 = time.monotonic()
    seqs = sequences(args.repeat)
    with tempfile.TemporaryDirectory() as tmp:
        worker = asyncio.run(worker_round_trips(Path(tmp), args.repeat))
        print(f"worker {worker}", flush=True)
        load_rows = asyncio.run(loads(Path(tmp), args.load_repeat))
    settings = {
        "repeat": args.repeat,
        "load_repeat": args.load_repeat,
        "prompt_words": list(PROMPT_WORDS),
        "sampling": SAMPLED,
        "model_filesystems": {
            "smollm2": filesystem(smollm2_gguf_path()),
            "gemma3": filesystem(gemma3_gguf_path()),
        },
        "wall_s": round(time.monotonic() - t0, 1),
    }
    report = {"meta": run_meta(settings), "sequences": seqs, "worker": worker, "loads": load_rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
