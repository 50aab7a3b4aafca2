"""How much each packaged model's call holds Python's interpreter lock (docs/benchmarks.md,
"The simulator against the real stack").

The inference worker hosts every model of the default stack in one Python process, one
thread per model. While one model's call holds the interpreter lock, the others' Python
steps wait. For each model, a Python thread counts in a loop while the model serves one
request in another thread of the same process; its speed during the call, relative to
its speed alone, says how much of the call left the lock free (100 %: the call releases
it throughout; near 0: it holds it throughout). Medians over ``--repeat`` calls.

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


def spinner_speed(call: Callable[[], object]) -> tuple[float, float]:
    """(the counting thread's speed during ``call`` / its speed alone, the call's seconds)."""
    count = 0
    stop = threading.Event()

    def spin() -> None:
        nonlocal count
        while not stop.is_set():
            count += 1

    thread = threading.Thread(target=spin)
    thread.start()
    time.sleep(0.2)
    c0, t0 = count, time.perf_counter()
    time.sleep(0.3)
    alone = (count - c0) / (time.perf_counter() - t0)
    c0, t0 = count, time.perf_counter()
    call()
    took = time.perf_counter() - t0
    during = (count - c0) / took
    stop.set()
    thread.join()
    return during / alone, took


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
        rows.append(
            {
                "model": name,
                "free_share": round(statistics.median(r[0] for r in runs), 3),
                "call_s": round(statistics.median(r[1] for r in runs), 3),
            }
        )
        print(rows[-1])
    report = {"meta": run_meta({"repeat": args.repeat}), "models": rows}
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
