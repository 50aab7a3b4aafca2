"""How much each packaged model's call holds Python's interpreter lock (docs/benchmarks.md,
"The simulator against the real stack").

The inference worker hosts every model of the default stack in one Python process, one
thread per model. While one model's call holds the interpreter lock, the others' Python
steps wait. For each model, a Python thread counts in a loop while the model serves one
request in another thread of the same process, and so does a process beside it; the
thread's speed during the call relative to alone, divided by the process's (which only
shares the cores), says how much of the call left the lock free (100 %: the call
releases it throughout; near 0: it holds it throughout). Medians over ``--repeat``
calls.

    .venv/bin/python bench/bench_gil.py     # writes bench/results/gil.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from meta import run_meta  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "gil.json"
TEXT = "What is the weather going to be like tomorrow morning in the city?"


def _count_in_process(counter: Any, stop: Any) -> None:
    while not stop.is_set():
        counter.value += 1


def spinner_speed(call: Callable[[], object]) -> tuple[float, float, float]:
    """(a counting thread's speed during ``call`` / alone, a counting process's speed
    during ``call`` / alone, the call's seconds). The process shares only the cores with
    the call; the thread shares the cores and the interpreter lock."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    shared, stop_proc = ctx.Value("q", 0, lock=False), ctx.Event()
    proc = ctx.Process(target=_count_in_process, args=(shared, stop_proc))
    proc.start()
    count = 0
    stop = threading.Event()

    def spin() -> None:
        nonlocal count
        while not stop.is_set():
            count += 1

    thread = threading.Thread(target=spin)
    thread.start()
    time.sleep(0.3)
    c0, p0, t0 = count, shared.value, time.perf_counter()
    time.sleep(0.5)
    dt = time.perf_counter() - t0
    alone, alone_p = (count - c0) / dt, (shared.value - p0) / dt
    c0, p0, t0 = count, shared.value, time.perf_counter()
    call()
    took = time.perf_counter() - t0
    during, during_p = (count - c0) / took, (shared.value - p0) / took
    stop.set()
    stop_proc.set()
    thread.join()
    proc.join(5)
    return during / alone, during_p / alone_p, took


def models() -> dict[str, Callable[[], object]]:
    from tests.stack.support import astronaut_jpeg

    from accelmux.models import (
        LlamaTextModel,
        MiniLmEmbedder,
        OpenCvDetector,
        PiperSpeaker,
        PocketsphinxRecognizer,
    )

    tts = PiperSpeaker()
    tts.load()
    wav = bytes(tts.synthesize(TEXT).wav)
    asr = PocketsphinxRecognizer()
    asr.load()
    llm = LlamaTextModel.smollm2(n_ctx=512)
    llm.load()
    emb = MiniLmEmbedder()
    emb.load()
    det = OpenCvDetector()
    det.load()
    image = astronaut_jpeg()
    messages = [{"role": "user", "content": TEXT}]
    return {
        "asr (PocketSphinx)": lambda: asr.transcribe(wav),
        "tts (Piper, ONNX Runtime)": lambda: tts.synthesize(TEXT),
        "chat (SmolLM2, llama.cpp, 24 tokens)": lambda: llm.chat(messages, max_tokens=24),
        "embeddings (MiniLM, ONNX Runtime, 32 texts)": lambda: emb.embed([TEXT] * 32),
        "detect (OpenCV)": lambda: det.detect(image),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for name, call in models().items():
        call()  # warm
        runs = [spinner_speed(call) for _ in range(args.repeat)]
        thread = statistics.median(r[0] for r in runs)
        process = statistics.median(r[1] for r in runs)
        rows.append(
            {
                "model": name,
                "thread_speed": round(thread, 3),
                "process_speed": round(process, 3),
                # what the lock alone takes: the thread's speed beyond the cores' sharing
                "lock_free_share": round(min(1.0, thread / process), 3) if process else None,
                "call_s": round(statistics.median(r[2] for r in runs), 3),
            }
        )
        print(rows[-1])
    report = {"meta": run_meta({"repeat": args.repeat}), "models": rows}
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
