"""The default stack on this machine: shared vs separate memory, and voice protection.

1. **Memory** (``shared vs separate``): the default stack's models loaded by
   ``accelmux serve`` in ONE shared inference worker, then the same config with
   ``isolated: true`` on every service (one worker process each, as separate containers
   would run them). Resident memory is the PSS (``psutil memory_full_info().pss``) of
   the daemon's process tree, measured after every service is loaded and has served one
   request. Two rows: the six distinct models (chat, completion, embeddings, tts, asr,
   detect), and the full stack (plus ``indexer`` and ``camera``, which share the
   embeddings and detect models when hosted together).

2. **Memory truth**: in the shared full-stack run, each loaded service's ledger entry
   (weights + runtime + KV) beside what the worker measured for it.

3. **Protection**: the voice chain (ASR of a 4 s utterance -> chat reply of at most 24
   tokens -> TTS of the reply) is timed ``--chains`` times alone, then ``--chains``
   times again while batch embedding jobs of ``--texts`` texts (through ``/v1/jobs``,
   a new one submitted as soon as one ends) and two camera jobs (2 frames/s each) run:
   the load runs for as long as the chains do. The ratio is p95 under load / p95
   alone (p95 only from at least 20 chains). The same ratio without a manager: the
   same models called directly (the voice chain in this process, an embedding loop and
   the two cameras each in a process of its own, all at once, uncoordinated).

    .venv/bin/python bench/bench_stack.py            # writes bench/results/stack.json
    .venv/bin/python bench/bench_stack.py --quick    # 8 chains, no p95 (a check)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import render_bench  # noqa: E402
from meta import run_meta  # noqa: E402
from stats import summary  # noqa: E402
from tests.stack.support import Daemon, resident, run_daemon, stack_config  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "stack.json"
MIB = 2**20
UTTERANCE = "What is the weather going to be like tomorrow morning in the city?"
SYSTEM = "You are a voice assistant. Answer in one short sentence."
CHAT_TOKENS = 24
CAMERA_FPS = 2.0
MODEL_SERVICES = ("chat", "completion", "embeddings", "tts", "asr", "detect")


def texts(n: int) -> list[str]:
    topics = ["garden", "invoice", "holiday", "recipe", "router", "school", "car", "doctor"]
    return [
        f"Note {i}: a short document about the {topics[i % len(topics)]} written on day "
        f"{i % 365} with some details number {i * 7 % 1000}."
        for i in range(n)
    ]


def ratios(alone: list[float], loaded: list[float]) -> dict[str, float | None]:
    """Loaded / alone, for the median and (where both have 20 samples) the p95."""
    a, lo = summary(alone), summary(loaded)
    p95 = None
    if a["p95_s"] and lo["p95_s"] is not None:
        p95 = round(float(lo["p95_s"]) / float(a["p95_s"]), 2)
    return {
        "ratio_p95": p95,
        "ratio_p50": round(statistics.median(loaded) / statistics.median(alone), 2),
    }


# ---- memory ----------------------------------------------------------------------------
def tree_pss(pid: int) -> tuple[int, list[tuple[int, int]]]:
    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)]
    rows = []
    for p in procs:
        try:
            rows.append((p.pid, int(p.memory_full_info().pss)))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return sum(r[1] for r in rows), rows


def exercise(daemon: Daemon, services: list[str], wav: bytes) -> None:
    """Load every service and send it one request (lazy buffers count too)."""
    import base64

    from tests.stack.support import astronaut_jpeg

    for name in services:
        daemon.post(f"/admin/services/{name}/load")
    daemon.wait_loaded(*services, timeout=180)
    client = daemon.openai()
    image = base64.b64encode(astronaut_jpeg()).decode()
    client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "Hi"}], max_tokens=8
    )
    client.completions.create(model="completion", prompt="Once upon a time", max_tokens=8)
    client.embeddings.create(model="embeddings", input=texts(32))
    if "indexer" in services:
        client.embeddings.create(model="indexer", input=texts(32))
    client.audio.speech.create(model="tts", voice="joe", input=UTTERANCE).read()
    client.audio.transcriptions.create(model="asr", file=("a.wav", wav, "audio/wav"))
    client.post("/detections", body={"model": "detect", "image": image}, cast_to=object)


def memory_truth(daemon: Daemon) -> list[dict[str, Any]]:
    """Each loaded service that carries its model: the ledger beside the measurement."""

    def reported() -> bool:
        return all(
            s["backend"]["memory"]["weights"] is not None
            for s in daemon.services().values()
            if s["state"] == "loaded" and not s["backend"]["last_load"].get("shared")
        )

    daemon.wait(reported, timeout=30, what="a memory report from every loaded service")
    rows = []
    for name, svc in daemon.services().items():
        if svc["state"] != "loaded" or svc["backend"]["last_load"].get("shared"):
            continue  # a shared copy is carried by the service that loaded it
        estimate, measured = resident(svc)
        rows.append(
            {
                "service": name,
                "ledger_bytes": estimate,
                "measured_bytes": measured,
                "kv_bytes": svc["ledger"]["kv"],
            }
        )
    return rows


def memory_run(tmp: Path, *, isolated: bool, full: bool, wav: bytes) -> dict[str, Any]:
    config = stack_config(tmp / "data", camera_fps=0.5)
    services = config["services"]
    if not full:
        for name in [n for n in services if n not in MODEL_SERVICES]:
            del services[name]
    for svc in services.values():
        svc["backend"]["isolated"] = isolated
    if isolated:
        # alone in a process, each service carries its own interpreter and libraries, and
        # indexer and camera their own copies of the embeddings and detect models
        if full:
            services["indexer"]["memory"] = dict(services["embeddings"]["memory"])
            services["camera"]["memory"] = dict(services["detect"]["memory"])
        for svc in services.values():
            svc["memory"]["runtime"] = int(svc["memory"].get("runtime", 0)) + 96 * MIB
    with run_daemon(config, tmp) as daemon:
        exercise(daemon, list(services), wav)
        time.sleep(3.0)
        truth = memory_truth(daemon) if full and not isolated else None
        total, rows = tree_pss(daemon.proc.pid)
        daemon_pss = next(pss for pid, pss in rows if pid == daemon.proc.pid)
        return {
            "truth": truth,
            "mode": "separate" if isolated else "shared",
            "services": list(services),
            "processes": len(rows),
            "pss_total_bytes": total,
            "pss_daemon_bytes": daemon_pss,
            "pss_workers_bytes": total - daemon_pss,
        }


# ---- the voice chain ------------------------------------------------------------------------
def managed_chain(daemon: Daemon, wav: bytes) -> float:
    client = daemon.openai()
    start = time.perf_counter()
    heard = client.audio.transcriptions.create(model="asr", file=("u.wav", wav, "audio/wav")).text
    reply = client.chat.completions.create(
        model="voice",
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": heard}],
        max_tokens=CHAT_TOKENS,
        temperature=0,
    )
    answer = reply.choices[0].message.content or "Sorry."
    client.audio.speech.create(model="tts", voice="joe", input=answer).read()
    return time.perf_counter() - start


def run_chains(chain: Callable[[], float], n: int, gap_s: float) -> list[float]:
    """``n`` chains ``gap_s`` apart."""
    out: list[float] = []
    while len(out) < n:
        out.append(chain())
        time.sleep(gap_s)
    return out


class JobFeeder:
    """Keeps one embedding job of ``n_texts`` texts running through ``/jobs``: a new one
    is submitted as soon as the last one ends, until :meth:`stop`."""

    def __init__(self, daemon: Daemon, n_texts: int) -> None:
        self.daemon = daemon
        self.n_texts = n_texts
        self.jobs: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="job-feeder", daemon=True)

    def _submit(self) -> None:
        body = {"model": "indexer", "inputs": texts(self.n_texts)}
        job: Any = self.daemon.openai().post("/jobs", body=body, cast_to=object)
        self.jobs.append(str(job["id"]))

    def _state(self, job_id: str) -> dict[str, Any]:
        state: dict[str, Any] = self.daemon.get(f"/v1/jobs/{job_id}")
        return state

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            if self._state(self.jobs[-1])["status"] not in ("queued", "running"):
                self._submit()

    def start(self) -> None:
        self._submit()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def completed(self) -> int:
        """Texts embedded so far over every job."""
        return sum(int(self._state(j)["request_counts"]["completed"]) for j in self.jobs)


def managed_protection(tmp: Path, args: argparse.Namespace, wav: bytes) -> dict[str, Any]:
    # alone: the stack without cameras and without a job
    config = stack_config(tmp / "alone" / "data")
    del config["services"]["camera"]
    with run_daemon(config, tmp / "alone") as daemon:
        daemon.wait_loaded("chat", "tts", "asr")
        run_chains(lambda: managed_chain(daemon, wav), 2, 0.2)  # warm-up
        alone = run_chains(lambda: managed_chain(daemon, wav), args.chains, args.gap)
    # loaded: the same stack with two cameras, and the embedding job
    config = stack_config(tmp / "loaded" / "data", camera_fps=CAMERA_FPS)
    services = config["services"]
    services["camera2"] = {**services["camera"], "backend": dict(services["camera"]["backend"])}
    with run_daemon(config, tmp / "loaded") as daemon:
        daemon.wait_loaded("chat", "tts", "asr")
        daemon.post("/admin/services/indexer/load")
        daemon.wait_loaded("indexer", "camera", "camera2", timeout=120)
        run_chains(lambda: managed_chain(daemon, wav), 2, 0.2)  # warm-up
        feeder = JobFeeder(daemon, args.texts)
        feeder.start()
        time.sleep(2.0)
        frames_before = sum(c["frames_analysed"] for c in daemon.get("/v1/cameras")["data"])
        done_before = feeder.completed()
        t0 = time.monotonic()
        loaded = run_chains(lambda: managed_chain(daemon, wav), args.chains, args.gap)
        window = time.monotonic() - t0
        texts_done = feeder.completed() - done_before
        frames = sum(c["frames_analysed"] for c in daemon.get("/v1/cameras")["data"])
        feeder.stop()
        return {
            "alone": summary(alone),
            "loaded": summary(loaded),
            **ratios(alone, loaded),
            "jobs_submitted": len(feeder.jobs),
            "batch_texts_done_during_chains": texts_done,
            "camera_frames_during_chains": frames - frames_before,
            "window_s": round(window, 1),
        }


# ---- no manager: the same models called directly, uncoordinated ------------------------------
def _embed_worker(start: Any, stop: Any, n_texts: int, done: Any) -> None:
    """The job, over and over until ``stop``: its texts in batches of 32 (as the job
    runner sends them); ``done`` counts every text embedded."""
    from accelmux.models import MiniLmEmbedder

    model = MiniLmEmbedder()
    model.load()
    items = texts(n_texts)
    start.wait()
    while not stop.is_set():
        for i in range(0, n_texts, 32):
            if stop.is_set():
                return
            batch = items[i : i + 32]
            model.embed(batch)
            done.value += len(batch)


def _camera_worker(start: Any, stop: Any, source: str, done: Any) -> None:
    from accelmux.models import FrameReader, OpenCvDetector

    det = OpenCvDetector()
    det.load()
    start.wait()
    period = 1.0 / CAMERA_FPS
    for frame in FrameReader(source, fps=CAMERA_FPS, pace=False, loop=True):
        t = time.monotonic()
        det.detect_array(frame.image)
        done.value += 1
        if stop.is_set():
            return
        stop.wait(max(0.0, period - (time.monotonic() - t)))


def unmanaged_protection(tmp: Path, args: argparse.Namespace, wav: bytes) -> dict[str, Any]:
    from accelmux.models import LlamaTextModel, PiperSpeaker, PocketsphinxRecognizer
    from accelmux.worker.sample_clip import sample_clip

    asr, tts = PocketsphinxRecognizer(), PiperSpeaker()
    llm = LlamaTextModel.smollm2(n_ctx=512)
    for model in (asr, tts, llm):
        model.load()

    def chain() -> float:
        start = time.perf_counter()
        heard = asr.transcribe(wav).text
        reply = llm.chat(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": heard}],
            max_tokens=CHAT_TOKENS,
            temperature=0,
        ).text
        tts.synthesize(reply or "Sorry.")
        return time.perf_counter() - start

    run_chains(chain, 2, 0.2)
    alone = run_chains(chain, args.chains, args.gap)
    ctx = mp.get_context("spawn")
    start, stop = ctx.Event(), ctx.Event()
    embedded = ctx.Value("i", 0)
    frames = [ctx.Value("i", 0), ctx.Value("i", 0)]
    clip = str(sample_clip(tmp))
    embedder = ctx.Process(target=_embed_worker, args=(start, stop, args.texts, embedded))
    procs = [embedder]
    procs += [ctx.Process(target=_camera_worker, args=(start, stop, clip, f)) for f in frames]
    for p in procs:
        p.start()
    time.sleep(8.0)  # let them load
    start.set()
    time.sleep(2.0)
    t0 = time.monotonic()
    before = embedded.value
    frames_before = sum(f.value for f in frames)
    loaded = run_chains(chain, args.chains, args.gap)
    window = time.monotonic() - t0
    texts_done = embedded.value - before
    frames_done = sum(f.value for f in frames) - frames_before
    still_running = all(p.is_alive() for p in procs)
    stop.set()
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    if not still_running:
        raise RuntimeError("a load process ended before the loaded chains did")
    return {
        "alone": summary(alone),
        "loaded": summary(loaded),
        **ratios(alone, loaded),
        "batch_texts_done_during_chains": texts_done,
        "camera_frames_during_chains": frames_done,
        "window_s": round(window, 1),
    }


# ---- report ---------------------------------------------------------------------------------
def speech_wav() -> bytes:
    from accelmux.models import PiperSpeaker

    speaker = PiperSpeaker()
    speaker.load()
    wav = speaker.synthesize(UTTERANCE).wav
    speaker.unload()
    return bytes(wav)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="500 texts, 8 chains (no p95)")
    parser.add_argument("--texts", type=int, default=2000, help="texts per embedding job")
    parser.add_argument(
        "--chains", type=int, default=30, help="chains per phase (p95 needs at least 20)"
    )
    parser.add_argument("--gap", type=float, default=1.0, help="pause between chains (s)")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.texts, args.chains = 500, 8
    started = time.monotonic()
    wav = speech_wav()
    settings = {
        "texts_per_job": args.texts,
        "chains": args.chains,
        "gap_s": args.gap,
        "camera_fps": CAMERA_FPS,
        "chat_max_tokens": CHAT_TOKENS,
        "utterance": UTTERANCE,
    }
    report: dict[str, Any] = {
        "meta": run_meta(settings),
        "settings": settings,
        "memory": [],
        "protection": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench-stack-") as td:
        tmp = Path(td)
        if not args.skip_memory:
            for full, label in ((False, "6 models"), (True, "full stack (8 services)")):
                row: dict[str, Any] = {"label": label}
                for isolated in (False, True):
                    key = "separate" if isolated else "shared"
                    sub = tmp / f"mem-{int(full)}-{key}"
                    row[key] = memory_run(sub, isolated=isolated, full=full, wav=wav)
                    print(f"memory {label} {key}: {row[key]['pss_total_bytes'] / MIB:.0f} MiB")
                report["memory"].append(row)
        report["protection"]["accelmux"] = managed_protection(tmp / "managed", args, wav)
        print("accelmux:", report["protection"]["accelmux"])
        report["protection"]["unmanaged"] = unmanaged_protection(tmp / "unmanaged", args, wav)
        print("no manager:", report["protection"]["unmanaged"])
    report["wall_s"] = round(time.monotonic() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for block in (render_bench.stack_memory, render_bench.stack_truth, render_bench.stack_voice):
        print("\n" + block(report))
    print(f"\nwrote {args.out} ({report['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    sys.exit(main())
