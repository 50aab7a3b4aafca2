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
   tokens -> TTS of the reply) is timed ``--chains`` times alone and ``--chains`` times
   while batch embedding jobs of ``--texts`` texts (through ``/v1/jobs``, a new one
   submitted as soon as one ends) and two camera jobs (2 frames/s each) run. The two
   phases alternate in ``--blocks`` blocks each (alone, loaded, loaded, alone, ...: a
   drift in the shared machine's load falls on both), each accelmux block on a fresh
   daemon (the alone one without cameras and jobs). Reported per phase: p50 and p95
   with 95 % bootstrap intervals, the ratios loaded / alone with theirs (both phases
   resampled), and over the loaded blocks the cameras' frame rate between the chains
   (what a camera keeps) and during them, and the batch throughput. The same without a
   manager: the same models called directly (the voice chain in this process, an
   embedding loop and the two cameras each in a process of their own, running in the
   loaded blocks and idle in the alone ones). ``--setups`` picks the rows: ``accelmux``,
   ``accelmux-cameras-not-steady`` (the cameras with ``steady: false``, their frames held
   while voice runs) and ``unmanaged``.

    .venv/bin/python bench/bench_stack.py            # writes bench/results/stack.json
    .venv/bin/python bench/bench_stack.py --setups accelmux,accelmux-cameras-not-steady,unmanaged
    .venv/bin/python bench/bench_stack.py --quick    # 2 blocks of 4 chains, no p95 (a check)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import render_bench  # noqa: E402
from meta import run_meta  # noqa: E402
from stats import bootstrap_interval, summary  # noqa: E402
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


@dataclass
class Phase:
    """The chains of one phase (alone or loaded) over its blocks, and what ran beside them."""

    chains: list[float] = field(default_factory=list)
    window_s: float = 0.0
    #: camera frames analysed over the blocks, and inside the voice chains
    frames: int = 0
    frames_in_chains: int = 0
    batch_texts: int = 0
    blocks: list[dict[str, Any]] = field(default_factory=list)

    def add(self, block: dict[str, Any]) -> None:
        self.blocks.append({k: v for k, v in block.items() if k != "chains"})
        self.chains += block["chains"]
        self.window_s += block["window_s"]
        self.frames += block.get("frames", 0)
        self.frames_in_chains += block.get("frames_in_chains", 0)
        self.batch_texts += block.get("batch_texts", 0)


def camera_frames(daemon: Daemon) -> int:
    return sum(int(c["frames_analysed"]) for c in daemon.get("/v1/cameras")["data"])


def counted_chains(
    chain: Callable[[], float], n: int, gap_s: float, frames: Callable[[], int] | None
) -> dict[str, Any]:
    """``n`` chains ``gap_s`` apart; with ``frames``, the camera frames analysed over the
    block and inside the chains (read before and after each)."""
    t0 = time.monotonic()
    first = frames() if frames else 0
    out: list[float] = []
    inside = 0
    for _ in range(n):
        before = frames() if frames else 0
        out.append(chain())
        if frames:
            inside += frames() - before
        time.sleep(gap_s)
    block: dict[str, Any] = {"chains": out, "window_s": time.monotonic() - t0}
    if frames:
        block |= {"frames": frames() - first, "frames_in_chains": inside}
    return block


def _loaded_config(tmp: Path, steady: bool) -> dict[str, Any]:
    config = stack_config(tmp / "data", camera_fps=CAMERA_FPS)
    services = config["services"]
    services["camera2"] = {**services["camera"], "backend": dict(services["camera"]["backend"])}
    if not steady:
        for name in ("camera", "camera2"):
            services[name]["steady"] = False
    return config


def managed_block(
    tmp: Path, args: argparse.Namespace, wav: bytes, loaded: bool, steady: bool
) -> dict[str, Any]:
    """One block of chains on a fresh daemon: alone (no camera, no job) or loaded (two
    cameras and the embedding jobs)."""
    if not loaded:
        config = stack_config(tmp / "data")
        del config["services"]["camera"]
        with run_daemon(config, tmp) as daemon:
            daemon.wait_loaded("chat", "tts", "asr")
            run_chains(lambda: managed_chain(daemon, wav), 2, 0.2)  # warm-up
            return counted_chains(lambda: managed_chain(daemon, wav), args.block, args.gap, None)
    with run_daemon(_loaded_config(tmp, steady), tmp) as daemon:
        daemon.wait_loaded("chat", "tts", "asr")
        daemon.post("/admin/services/indexer/load")
        daemon.wait_loaded("indexer", "camera", "camera2", timeout=120)
        run_chains(lambda: managed_chain(daemon, wav), 2, 0.2)  # warm-up
        feeder = JobFeeder(daemon, args.texts)
        feeder.start()
        time.sleep(2.0)
        done_before = feeder.completed()
        block = counted_chains(
            lambda: managed_chain(daemon, wav), args.block, args.gap, lambda: camera_frames(daemon)
        )
        block["batch_texts"] = feeder.completed() - done_before
        block["jobs_submitted"] = len(feeder.jobs)
        feeder.stop()
        return block


def block_order(blocks: int) -> list[bool]:
    """Which phase each block runs (False: alone, True: loaded), alternated A B B A ...
    so that a drift in the machine's load falls on both phases alike."""
    order: list[bool] = []
    for i in range(blocks):
        pair = [False, True] if i % 2 == 0 else [True, False]
        order += pair
    return order


def managed_protection(
    tmp: Path, args: argparse.Namespace, wav: bytes, steady: bool
) -> dict[str, Any]:
    phases = {False: Phase(), True: Phase()}
    for i, loaded in enumerate(block_order(args.blocks)):
        block = managed_block(tmp / f"block-{i}", args, wav, loaded, steady)
        phases[loaded].add(block)
        print(
            f"  block {i} {'loaded' if loaded else 'alone'}: median "
            f"{statistics.median(block['chains']):.2f} s",
            flush=True,
        )
    return report_phases(phases[False], phases[True])


def report_phases(alone: Phase, loaded: Phase) -> dict[str, Any]:
    """Both phases' percentiles with bootstrap intervals, the ratios, and the cameras' and
    the batch job's throughput over the loaded blocks, inside and outside the chains."""
    nominal = 2 * CAMERA_FPS
    in_chains_s = sum(loaded.chains)
    outside_s = max(1e-9, loaded.window_s - in_chains_s)
    outside = loaded.frames - loaded.frames_in_chains
    return {
        "alone": summary(alone.chains),
        "loaded": summary(loaded.chains),
        **ratios(alone.chains, loaded.chains),
        "intervals": intervals(alone.chains, loaded.chains),
        "camera": {
            "nominal_fps": nominal,
            "fps_outside_chains": outside / outside_s,
            "fps_in_chains": loaded.frames_in_chains / max(1e-9, in_chains_s),
            "share_of_nominal_outside_chains": outside / outside_s / nominal,
        },
        "batch_texts_done_during_chains": loaded.batch_texts,
        "camera_frames_during_chains": loaded.frames,
        "window_s": round(loaded.window_s, 1),
        "blocks": {"alone": alone.blocks, "loaded": loaded.blocks},
        "samples": {"alone": alone.chains, "loaded": loaded.chains},
    }


def intervals(alone: list[float], loaded: list[float]) -> dict[str, Any]:
    """95 % bootstrap intervals of each phase's p50 and p95 and of the two ratios."""
    out: dict[str, Any] = {}
    for q, name in ((0.5, "p50"), (0.95, "p95")):
        out[f"alone_{name}"] = bootstrap_interval(alone, q)
        out[f"loaded_{name}"] = bootstrap_interval(loaded, q)
        out[f"ratio_{name}"] = bootstrap_interval(loaded, q, against=alone)
    return out


# ---- no manager: the same models called directly, uncoordinated ------------------------------
def _embed_worker(go: Any, stop: Any, n_texts: int, done: Any) -> None:
    """The job, over and over while ``go`` is set, until ``stop``: its texts in batches of
    32 (as the job runner sends them); ``done`` counts every text embedded."""
    from accelmux.models import MiniLmEmbedder

    model = MiniLmEmbedder()
    model.load()
    items = texts(n_texts)
    while not stop.is_set():
        for i in range(0, n_texts, 32):
            while not go.wait(0.1):
                if stop.is_set():
                    return
            batch = items[i : i + 32]
            model.embed(batch)
            done.value += len(batch)


def _camera_worker(go: Any, stop: Any, source: str, done: Any) -> None:
    """A camera at CAMERA_FPS while ``go`` is set, until ``stop``."""
    from accelmux.models import FrameReader, OpenCvDetector

    det = OpenCvDetector()
    det.load()
    period = 1.0 / CAMERA_FPS
    for frame in FrameReader(source, fps=CAMERA_FPS, pace=False, loop=True):
        while not go.wait(0.1):
            if stop.is_set():
                return
        t = time.monotonic()
        det.detect_array(frame.image)
        done.value += 1
        if stop.is_set():
            return
        stop.wait(max(0.0, period - (time.monotonic() - t)))


def unmanaged_protection(tmp: Path, args: argparse.Namespace, wav: bytes) -> dict[str, Any]:
    """The same chains on the models called directly: the embedding loop and the two
    cameras each in a process of their own, running in the loaded blocks, idle (waiting,
    loaded) in the alone ones."""
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
    ctx = mp.get_context("spawn")
    go, stop = ctx.Event(), ctx.Event()
    embedded = ctx.Value("i", 0)
    frames = [ctx.Value("i", 0), ctx.Value("i", 0)]
    clip = str(sample_clip(tmp))
    procs = [ctx.Process(target=_embed_worker, args=(go, stop, args.texts, embedded))]
    procs += [ctx.Process(target=_camera_worker, args=(go, stop, clip, f)) for f in frames]
    for p in procs:
        p.start()
    time.sleep(8.0)  # let them load
    phases = {False: Phase(), True: Phase()}
    try:
        for i, loaded in enumerate(block_order(args.blocks)):
            if loaded:
                go.set()
                time.sleep(2.0)
            before = embedded.value
            block = counted_chains(
                chain,
                args.block,
                args.gap,
                (lambda: sum(f.value for f in frames)) if loaded else None,
            )
            if loaded:
                block["batch_texts"] = embedded.value - before
                go.clear()
                if not all(p.is_alive() for p in procs):
                    raise RuntimeError("a load process ended before the loaded chains did")
            phases[loaded].add(block)
            print(
                f"  block {i} {'loaded' if loaded else 'alone'}: median "
                f"{statistics.median(block['chains']):.2f} s",
                flush=True,
            )
    finally:
        stop.set()
        go.set()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return report_phases(phases[False], phases[True])


# ---- report ---------------------------------------------------------------------------------
def speech_wav() -> bytes:
    from accelmux.models import PiperSpeaker

    speaker = PiperSpeaker()
    speaker.load()
    wav = speaker.synthesize(UTTERANCE).wav
    speaker.unload()
    return bytes(wav)


#: The setups of the protection table, in order; ``--setups`` picks some.
SETUPS = {
    "accelmux": "accelmux",
    "accelmux-cameras-not-steady": "accelmux, cameras `steady: false`",
    "unmanaged": "no manager",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="500 texts, 2 blocks of 4 chains")
    parser.add_argument("--texts", type=int, default=2000, help="texts per embedding job")
    parser.add_argument(
        "--chains", type=int, default=100, help="chains per phase (p95 needs at least 20)"
    )
    parser.add_argument(
        "--blocks", type=int, default=5, help="blocks per phase, alone and loaded alternated"
    )
    parser.add_argument("--gap", type=float, default=1.0, help="pause between chains (s)")
    parser.add_argument(
        "--setups",
        default="accelmux,unmanaged",
        help=f"comma-separated, of {', '.join(SETUPS)} (default accelmux,unmanaged)",
    )
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.texts, args.chains, args.blocks = 500, 8, 2
    setups = [x.strip() for x in args.setups.split(",") if x.strip()]
    unknown = sorted(set(setups) - set(SETUPS))
    if unknown or not setups:
        parser.error(f"unknown setups {unknown} (known: {', '.join(SETUPS)})")
    if args.blocks < 1 or args.chains < args.blocks:
        parser.error("need --blocks >= 1 and at least one chain per block")
    args.block = -(-args.chains // args.blocks)  # chains per block, rounded up
    started = time.monotonic()
    wav = speech_wav()
    settings = {
        "texts_per_job": args.texts,
        "chains": args.block * args.blocks,
        "blocks": args.blocks,
        "chains_per_block": args.block,
        "gap_s": args.gap,
        "camera_fps": CAMERA_FPS,
        "chat_max_tokens": CHAT_TOKENS,
        "utterance": UTTERANCE,
        "setups": setups,
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
        for setup in setups:
            print(f"{SETUPS[setup]}:", flush=True)
            if setup == "unmanaged":
                result = unmanaged_protection(tmp / setup, args, wav)
            else:
                steady = setup == "accelmux"
                result = managed_protection(tmp / setup, args, wav, steady)
            report["protection"][setup] = result
            print({k: v for k, v in result.items() if k not in ("samples", "blocks")})
    report["wall_s"] = round(time.monotonic() - started, 1)
    report["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for block in (render_bench.stack_memory, render_bench.stack_truth, render_bench.stack_voice):
        print("\n" + block(report))
    print(f"\nwrote {args.out} ({report['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    sys.exit(main())
