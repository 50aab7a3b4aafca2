"""Two LLMs of the default stack beside the voice chain: ``bench/results/stack_llms.json``.

The default stack's two language models, SmolLM2 (chat) and Gemma 3 270M (completion),
are requested alternately by a closed-loop client (streamed, ``--tokens`` tokens each)
under a host budget that cannot hold both KV pools at their ceiling, while voice chains
(ASR of a 4 s utterance -> a short chat reply -> TTS) run. The chat load goes to
``assistant``, an interactive service on the same SmolLM2 file as the realtime ``chat``
service the voice chain uses (the worker shares one loaded copy): a household's chat
users are interactive, its voice assistant realtime.

Reported: the voice chain's p95 under that load divided by its p95 alone (at least 20
chains per phase; the loaded phase goes on until each LLM streamed 20 times, at most
five times as many chains), the TTFT (time to the first streamed token) p50/p95 of
each LLM, and
how many streams ended in an error (none may). The budget is measured in a first run,
after each LLM streamed once and two voice chains ran: every service at its KV floor with
what its allocator kept (the floor the policy counts for a kept service), plus the most
activation memory the voice chain's requests held at once and the most one LLM request
held (sampled every 20 ms), plus half of what the two LLMs' pools may grow: both pools
cannot be at their ceiling at once.

    .venv/bin/python bench/bench_stack_llms.py            # 30 chains per phase
    .venv/bin/python bench/bench_stack_llms.py --quick    # 8 chains (no p95)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_stack import managed_chain, ratios, run_chains, speech_wav  # noqa: E402
from meta import run_meta  # noqa: E402
from stats import summary  # noqa: E402
from tests.stack.support import Daemon, run_daemon, stack_config  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "stack_llms.json"
PROMPT_CHAT = "Tell me a short story about a robot who learns to garden."
PROMPT_COMPLETION = "Once upon a time, in a small village by the sea, there lived"
VOICE_SERVICES = ("chat", "tts", "asr")
#: The two LLMs the load streams from, in turn.
LLM_SERVICES = ("assistant", "completion")


def bench_config(data_dir: Path) -> dict[str, Any]:
    """The default stack with an interactive ``assistant`` on the chat model, without the
    camera and the batch services (they are not what this measures)."""
    config = stack_config(data_dir)
    services = config["services"]
    for name in ("camera", "indexer", "embeddings", "detect"):
        services.pop(name, None)
    chat = services["chat"]
    services["assistant"] = {
        **chat,
        "class": "interactive",
        "residency": "warm",
        "model": "assistant",
        "aliases": [],
        "backend": dict(chat["backend"]),
    }
    return config


def peak_active(daemon: Daemon, names: tuple[str, ...], work: Callable[[], object]) -> int:
    """The most activation memory (``active``) the services ``names`` held at once while
    ``work`` ran (sampled every 20 ms)."""
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            services = daemon.services()
            peak = max(peak, sum(int(services[n]["ledger"]["active"]) for n in names))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        work()
    finally:
        done.set()
        sampler.join(5)
    return peak


def tight_budget(daemon: Daemon, wav: bytes, tokens: int) -> tuple[int, dict[str, Any]]:
    """A budget that holds everything at its floor as the policy measures it, the voice
    chain's working set and one LLM request's, but not both LLM pools at their ceiling.

    The floors are read after both LLMs streamed and two voice chains ran: a service's
    allocator keeps what its first requests took (``reserved``), and the policy counts
    it in the floor a kept service holds. Read before, the floors missed it, and the
    budget sat on an edge where the completion model fit beside the kept services in one
    run and not in the next."""
    load = AlternatingLoad(daemon, tokens)

    def each_llm_once() -> None:
        for model in LLM_SERVICES:
            load.one(model)

    llm = peak_active(daemon, LLM_SERVICES, each_llm_once)
    voice = peak_active(
        daemon, VOICE_SERVICES, lambda: run_chains(lambda: managed_chain(daemon, wav), 2, 0.2)
    )
    services = daemon.services()
    floors = 0
    ceilings = 0
    for s in services.values():
        ledger = s["ledger"]
        floors += ledger["weights"] + ledger["runtime"] + ledger["reserved"]
        floors += int(s["kv_floor_bytes"])
        if s["name"] in LLM_SERVICES:
            ceilings += int(s["kv_ceiling_bytes"]) - int(s["kv_floor_bytes"])
    device = daemon.status()["devices"][0]
    headroom = int(device.get("headroom_bytes") or 256 * 2**20)
    budget = floors + voice + llm + ceilings // 2 + headroom
    return budget, {
        "floors_bytes": floors,
        "voice_working_set_bytes": voice,
        "llm_working_set_bytes": llm,
        "ceilings_above_floor_bytes": ceilings,
    }


class AlternatingLoad:
    """Streams assistant and completion requests one after the other, until stopped;
    records each stream's TTFT and whether it ended in an error."""

    def __init__(self, daemon: Daemon, tokens: int) -> None:
        self.daemon = daemon
        self.tokens = tokens
        self.ttft: dict[str, list[float]] = {"assistant": [], "completion": []}
        self.errors: list[str] = []
        self.streams = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llm-load", daemon=True)

    def one(self, model: str) -> None:
        """Stream one request from ``model``, recording its TTFT or its error."""
        client = self.daemon.openai()
        start = time.perf_counter()
        first: float | None = None
        try:
            if model == "assistant":
                stream: Any = client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": PROMPT_CHAT}],
                    max_tokens=self.tokens,
                    temperature=0,
                    stream=True,
                )
                for chunk in stream:
                    if first is None and chunk.choices and chunk.choices[0].delta.content:
                        first = time.perf_counter()
            else:
                stream = client.completions.create(
                    model=model,
                    prompt=PROMPT_COMPLETION,
                    max_tokens=self.tokens,
                    temperature=0,
                    stream=True,
                )
                for chunk in stream:
                    if first is None and chunk.choices and chunk.choices[0].text:
                        first = time.perf_counter()
        except Exception as exc:  # any error ends the stream: that is what is counted
            self.errors.append(f"{model}: {type(exc).__name__}: {exc}"[:300])
            return
        self.streams += 1
        if first is not None:
            self.ttft[model].append(first - start)

    def _run(self) -> None:
        turn = 0
        while not self._stop.is_set():
            self.one(LLM_SERVICES[turn % 2])
            turn += 1

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 chains per phase (no p95)")
    parser.add_argument("--chains", type=int, default=30)
    parser.add_argument("--gap", type=float, default=1.0, help="pause between chains (s)")
    parser.add_argument("--tokens", type=int, default=48, help="tokens per load stream")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.chains = 8
    started = time.monotonic()
    wav = speech_wav()
    with tempfile.TemporaryDirectory(prefix="bench-stack-llms-") as td:
        tmp = Path(td)
        config = bench_config(tmp / "probe" / "data")
        with run_daemon(config, tmp / "probe") as daemon:
            daemon.wait_loaded(*VOICE_SERVICES)
            daemon.post("/admin/services/completion/load")
            daemon.post("/admin/services/assistant/load")
            daemon.wait_loaded("completion", "assistant", timeout=120)
            budget, sizes = tight_budget(daemon, wav, args.tokens)
        config = bench_config(tmp / "run" / "data")
        for dev in config["devices"].values():
            dev["budget"] = budget
        with run_daemon(config, tmp / "run") as daemon:
            daemon.wait_loaded(*VOICE_SERVICES)
            run_chains(lambda: managed_chain(daemon, wav), 2, 0.2)  # warm-up
            alone = run_chains(lambda: managed_chain(daemon, wav), args.chains, args.gap)
            load = AlternatingLoad(daemon, args.tokens)
            load.start()
            time.sleep(3.0)
            loaded = run_chains(lambda: managed_chain(daemon, wav), args.chains, args.gap)
            # Chains go on until each LLM has enough TTFT samples for a p95 (at most 5x).
            while len(loaded) < 5 * args.chains and min(map(len, load.ttft.values())) < 20:
                loaded += run_chains(lambda: managed_chain(daemon, wav), 1, args.gap)
            load.stop()
            status = daemon.status()
    counts = status.get("counts") or {}
    report: dict[str, Any] = {
        "meta": run_meta(
            {"chains": args.chains, "gap_s": args.gap, "tokens": args.tokens, "budget": budget}
        ),
        "budget_bytes": budget,
        **sizes,
        "voice": {"alone": summary(alone), "loaded": summary(loaded), **ratios(alone, loaded)},
        "ttft": {m: summary(v) for m, v in load.ttft.items()},
        "streams": load.streams,
        "stream_errors": load.errors,
        "pauses": sum(n for k, n in counts.items() if k.startswith("pause:")),
        "resumes": sum(n for k, n in counts.items() if k.startswith("resume:")),
        "wall_s": round(time.monotonic() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "meta"}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
