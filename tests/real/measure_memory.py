"""Measure each real model's memory, each in a fresh Python process.

    .venv/bin/python tests/real/measure_memory.py            # all models, a Markdown table
    .venv/bin/python tests/real/measure_memory.py --json     # the same as JSON
    .venv/bin/python tests/real/measure_memory.py --child smollm2 --n-ctx 2048  # one

For each model the child process imports the runtime first (its import cost is
reported on its own), then measures with :class:`accelmux.models.measure.PeakRss`:
- load: RSS after ``load()`` minus RSS before (and the peak during it);
- first request: the peak RSS during the first typical request above the RSS before it
  (it includes first-touch costs: buffers allocated lazily, pages of mapped files);
- request: the same for a second, identical request;
- peak: the highest RSS over load and both requests, above the RSS before the load;
- steady: RSS after both requests minus RSS before the load;
- estimate: the wrapper's ``memory_estimate()``.
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import subprocess
import sys
import tempfile
import time
import wave
from collections.abc import Callable
from pathlib import Path
from typing import Any

from accelmux.models.measure import PeakRss, rss_bytes

MiB = 2**20
RUNTIME_MODULES = {
    "smollm2": ["llama_cpp", "llama_cpp.llama_chat_format", "numpy"],
    "gemma3": ["llama_cpp", "llama_cpp.llama_chat_format", "numpy"],
    "minilm": ["onnxruntime", "tokenizers", "numpy"],
    "piper": ["piper", "onnxruntime", "numpy"],
    "pocketsphinx": ["pocketsphinx", "piper", "numpy"],
    "opencv": ["cv2", "numpy", "skimage.data"],
}
#: Every packaged model, the LLMs at two context sizes (bench/bench_models.py runs them all).
RUNS = (
    ("smollm2", 2048),
    ("smollm2", 8192),
    ("gemma3", 2048),
    ("gemma3", 8192),
    ("minilm", 2048),
    ("piper", 2048),
    ("pocketsphinx", 2048),
    ("opencv", 2048),
)
SENTENCE = "Please turn on the kitchen lights and set the temperature to twenty degrees."


def _speak_to_file(path: str) -> None:
    from accelmux.models.tts import PiperSpeaker

    speaker = PiperSpeaker()
    speaker.load()
    Path(path).write_bytes(speaker.synthesize(SENTENCE).wav)


def _child(name: str, n_ctx: int, wav_path: str | None) -> dict[str, Any]:
    before_import = rss_bytes()
    for module in RUNTIME_MODULES[name]:
        importlib.import_module(module)
    import_bytes = rss_bytes() - before_import

    model: Any
    request: Callable[[], object]
    extra: dict[str, Any] = {}
    if name in ("smollm2", "gemma3"):
        from accelmux.models.chat import LlamaTextModel

        model = LlamaTextModel.smollm2(n_ctx=n_ctx) if name == "smollm2" else None
        if model is None:
            model = LlamaTextModel.gemma3(n_ctx=n_ctx)
        breakdown = model.memory_breakdown()
        extra = {
            "n_ctx": n_ctx,
            "weights": breakdown.weights_bytes,
            "kv": breakdown.kv_bytes,
            "compute": breakdown.compute_bytes,
            "output": breakdown.output_bytes,
            "runtime": breakdown.runtime_bytes,
            "resident_estimate": breakdown.resident_bytes,
        }
        if name == "smollm2":
            messages = [{"role": "user", "content": "Name three fruits."}]

            def request() -> object:
                return model.chat(messages, max_tokens=32, temperature=0)

        else:

            def request() -> object:
                return model.complete("The capital of France is", max_tokens=32, temperature=0)

    elif name == "minilm":
        from accelmux.models.embed import MiniLmEmbedder

        model = MiniLmEmbedder()
        texts = [f"sentence number {i} about the weather and the lights" for i in range(24)]
        texts += ["a much longer text " * 60] * 8  # truncated to max_length tokens

        def request() -> object:
            return model.embed(texts)

    elif name == "piper":
        from accelmux.models.tts import PiperSpeaker

        model = PiperSpeaker()

        def request() -> object:
            return model.synthesize(SENTENCE)

    elif name == "pocketsphinx":
        from accelmux.models.asr import PocketsphinxRecognizer

        if wav_path is None:
            raise SystemExit("pocketsphinx needs --wav")
        wav = Path(wav_path).read_bytes()
        with wave.open(io.BytesIO(wav)) as w:
            extra = {"audio_s": round(w.getnframes() / w.getframerate(), 2)}
        model = PocketsphinxRecognizer()

        def request() -> object:
            return model.transcribe(wav)

    elif name == "opencv":
        import cv2
        import skimage.data

        from accelmux.models.detect import OpenCvDetector

        model = OpenCvDetector()
        rgb = skimage.data.astronaut()
        _, jpg = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
        image = jpg.tobytes()

        def request() -> object:
            return model.detect(image)

    else:
        raise SystemExit(f"unknown model {name!r}")

    estimate = model.memory_estimate()
    t0 = time.perf_counter()
    with PeakRss() as load:
        model.load()
    t1 = time.perf_counter()
    with PeakRss() as first:
        request()
    t2 = time.perf_counter()
    with PeakRss() as again:
        request()
    t3 = time.perf_counter()
    return {
        "model": name,
        "import": import_bytes,
        "load": load.end_delta,
        "load_peak": load.peak_delta,
        "first_request_peak": first.peak_delta,
        "request_peak": again.peak_delta,
        "peak": max(load.peak, first.peak, again.peak) - load.start,
        "steady": rss_bytes() - load.start,
        "estimate": estimate,
        "method": again.method,
        "load_s": round(t1 - t0, 3),
        "first_request_s": round(t2 - t1, 3),
        "request_s": round(t3 - t2, 3),
        **extra,
    }


def _run(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, __file__, *args], check=True, capture_output=True, text=True, timeout=300
    )
    return out.stdout


def measure(name: str, n_ctx: int = 2048) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter and return its numbers (bytes)."""
    args = ["--child", name, "--n-ctx", str(n_ctx)]
    with tempfile.TemporaryDirectory() as tmp:
        if name == "pocketsphinx":  # the speech to recognise comes from another process
            wav = str(Path(tmp) / "speech.wav")
            _run("--speak-to", wav)
            args += ["--wav", wav]
        result: dict[str, Any] = json.loads(_run(*args).strip().splitlines()[-1])
    return result


def _mib(value: int) -> str:
    return f"{value / MiB:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help="measure one model in this process")
    parser.add_argument("--n-ctx", type=int, default=2048)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--wav", help="speech for --child pocketsphinx")
    parser.add_argument("--speak-to", help="write the test sentence as a WAV file")
    args = parser.parse_args()
    if args.speak_to:
        _speak_to_file(args.speak_to)
        return
    if args.child:
        print(json.dumps(_child(args.child, args.n_ctx, args.wav)))
        return
    results = [measure(name, n_ctx) for name, n_ctx in RUNS]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(
        "| model | runtime import | load (peak) | 1st request peak | 2nd request peak "
        "| overall peak | steady | estimate |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        label = r["model"] + (f" n_ctx={r['n_ctx']}" if "n_ctx" in r else "")
        print(
            f"| {label} | {_mib(r['import'])} | {_mib(r['load'])} ({_mib(r['load_peak'])}) "
            f"| {_mib(r['first_request_peak'])} | {_mib(r['request_peak'])} "
            f"| {_mib(r['peak'])} | {_mib(r['steady'])} | {_mib(r['estimate'])} |"
        )
    print("\nMiB; RSS deltas measured with psutil and /proc/self VmHWM")


if __name__ == "__main__":
    main()
