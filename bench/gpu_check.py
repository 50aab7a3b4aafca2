"""The one-call GPU check: the default stack offloaded to one NVIDIA GPU, plus a
llama-server, under a short mixed load; what accelmux accounted beside what NVML saw.

``scripts/gpu-check`` builds what the check needs (a CUDA llama-cpp-python, onnxruntime-gpu
and a CUDA llama-server, into a venv of its own) and runs this module; run alone, it uses
the Python it runs on:

    python bench/gpu_check.py --llama-server PATH   # a real GPU: bench/results/gpu_check.json
    python bench/gpu_check.py --fake-nvml           # no GPU: the fake stack and a fake NVML

What it does:

1. starts ``accelmux serve`` with the default stack's LLMs, embeddings and TTS on an
   ``nvidia`` device (index 0; ASR and detection stay on the host: they have no GPU path)
   plus an external llama-server (``big``) on the same GPU;
2. times the voice chain (TTS of a sentence -> ASR of that audio -> a streamed chat reply)
   ``--chains`` times alone, then as many times while chat streams (completion and big)
   and embedding calls run in threads of their own;
3. reports, from ``/admin/status`` and NVML: per GPU process, the ledger's bytes of the
   services it hosts (weights + runtime + KV + active: accelmux's own accounting, not the
   measured correction) beside NVML's figure and the error in percent
   (``(ledger - nvml) / nvml x 100``); per service the same against what the monitor
   attributed to it; out-of-memory failures (must be 0); the voice chain's p95 loaded and
   alone; each LLM's time to first token (the gateway's p50/p95); where each model ran.

``--fake-nvml`` runs it all with the fake stack (fake backends on an ``nvidia`` device)
and the fake ``pynvml`` of ``bench/fake_nvml`` (the daemon and this module both load it):
it reports one GPU, and one process per fake service holding its ledger bytes times
``FAKE_SKEW``, so the error of every row is known. Nothing is built in that mode; the
tests run it end to end. A real run's JSON is written by a machine with a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import wave
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from meta import run_meta  # noqa: E402
from tests.stack.support import Daemon, run_daemon, stack_config  # noqa: E402

from accelmux.errors import is_out_of_memory  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "gpu_check.json"
FAKE_NVML_DIR = ROOT / "bench" / "fake_nvml"
#: In --fake-nvml mode each fake service's process holds its ledger bytes times this.
FAKE_SKEW = 1.25
FAKE_PID_BASE = 900_000
GIB = 2**30
MIB = 2**20
SENTENCE = "What is the weather going to be like tomorrow morning in the city?"
#: Services of the default stack moved onto the GPU (the others have no GPU path).
GPU_SERVICES = ("chat", "completion", "embeddings", "indexer", "tts")
LEDGER_CATEGORIES = ("weights", "runtime", "kv", "active")


# -- figures (pure) ------------------------------------------------------------------------


def error_pct(ledger: int, measured: int) -> float | None:
    """``(ledger - measured) / measured x 100``, two decimals; None when nothing was
    measured."""
    if measured <= 0:
        return None
    return round((ledger - measured) * 100.0 / measured, 2)


def ledger_bytes(svc: dict[str, Any]) -> int:
    """What accelmux accounted for a service: weights + runtime + KV + active (the
    measured correction, ``reserved``, left out: it is NVML's figure fed back)."""
    return sum(int(svc["ledger"].get(c, 0)) for c in LEDGER_CATEGORIES)


def owners_from_status(status: dict[str, Any]) -> dict[int, list[str]]:
    """The GPU services of each process (the worker's pid or an external server's)."""
    gpu_devices = {d["name"] for d in status["devices"] if d["kind"] == "nvidia"}
    out: dict[int, list[str]] = {}
    for svc in status["services"]:
        pid = (svc.get("backend") or {}).get("pid")
        if svc["device"] in gpu_devices and pid is not None and svc["state"] == "loaded":
            out.setdefault(int(pid), []).append(svc["name"])
    return out


def process_rows(
    status: dict[str, Any], nvml: dict[int, int], owners: dict[int, list[str]]
) -> list[dict[str, Any]]:
    """Per GPU process: its services' ledger bytes beside NVML's figure. A worker's row
    counts its overhead (CUDA context, slack) on the ledger side, as the Manager does."""
    services = {s["name"]: s for s in status["services"]}
    overhead: dict[int, int] = {}
    for dev in status["devices"]:
        for worker in (dev.get("measured") or {}).get("workers") or []:
            overhead[int(worker["pid"])] = int(worker["overhead_bytes"])
    rows = []
    for pid, names in sorted(owners.items()):
        ledger = sum(ledger_bytes(services[n]) for n in names if n in services)
        measured = int(nvml.get(pid, 0))
        rows.append(
            {
                "pid": pid,
                "services": sorted(names),
                "ledger_bytes": ledger,
                "overhead_bytes": overhead.get(pid, 0),
                "nvml_bytes": measured,
                "error_pct": error_pct(ledger + overhead.get(pid, 0), measured),
                "error_pct_without_overhead": error_pct(ledger, measured),
            }
        )
    return rows


def service_rows(status: dict[str, Any]) -> list[dict[str, Any]]:
    """Per service on a GPU: ledger bytes beside what the monitor attributed to it."""
    gpu_devices = {d["name"] for d in status["devices"] if d["kind"] == "nvidia"}
    rows = []
    for svc in status["services"]:
        if svc["device"] not in gpu_devices:
            continue
        measured = svc.get("measured_bytes")
        ledger = ledger_bytes(svc)
        rows.append(
            {
                "service": svc["name"],
                "state": svc["state"],
                "accelerator": svc.get("accelerator"),
                "ledger_bytes": ledger,
                "measured_bytes": measured,
                "error_pct": error_pct(ledger, int(measured)) if measured is not None else None,
            }
        )
    return rows


def p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[max(0, -(-95 * len(ordered) // 100) - 1)], 4)


def ttft_rows(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each LLM's time to first token, as the gateway measured its streams."""
    out = {}
    for svc in status["services"]:
        if svc["kind"] not in ("chat", "completion"):
            continue
        usage = svc.get("usage") or {}
        out[svc["name"]] = {
            "ttft_p50_s": usage.get("ttft_p50_s"),
            "ttft_p95_s": usage.get("ttft_p95_s"),
            "tbt_p50_s": usage.get("tbt_p50_s"),
            "accelerator": svc.get("accelerator"),
        }
    return out


def count_ooms(errors: list[str], status: dict[str, Any], log: str) -> int:
    """Failures that say memory ran out (the words accelmux itself reads as an OOM):
    request errors, services' last errors, the daemon's log lines."""
    texts = [*errors, *(str(s.get("last_error") or "") for s in status["services"])]
    texts += log.splitlines()
    return sum(1 for text in texts if text and is_out_of_memory(RuntimeError(text)))


# -- NVML -----------------------------------------------------------------------------------


def nvml_snapshot(index: int = 0) -> dict[str, Any]:
    """The GPU's name, total and used bytes and used bytes per process (NVML)."""
    import pynvml  # the real one, or bench/fake_nvml's

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        name = pynvml.nvmlDeviceGetName(handle)
        per_pid: dict[int, int] = {}
        for getter in (
            pynvml.nvmlDeviceGetComputeRunningProcesses,
            pynvml.nvmlDeviceGetGraphicsRunningProcesses,
        ):
            for proc in getter(handle):
                if proc.usedGpuMemory is not None:
                    per_pid[int(proc.pid)] = per_pid.get(int(proc.pid), 0) + int(proc.usedGpuMemory)
        return {
            "name": name.decode() if isinstance(name, bytes) else str(name),
            "total_bytes": int(info.total),
            "used_bytes": int(info.used),
            "processes": per_pid,
        }
    finally:
        pynvml.nvmlShutdown()


def write_fake_state(path: Path, processes: dict[int, int], owners: dict[int, list[str]]) -> None:
    state = {
        "name": "Fake NVIDIA GPU",
        "total": 16 * GIB,
        "processes": {str(pid): n for pid, n in processes.items()},
        "owners": {str(pid): names for pid, names in owners.items()},
    }
    path.write_text(json.dumps(state), encoding="utf-8")


def fake_processes(status: dict[str, Any]) -> tuple[dict[int, int], dict[int, list[str]]]:
    """One process per loaded fake GPU service, holding its ledger bytes x FAKE_SKEW."""
    processes: dict[int, int] = {}
    owners: dict[int, list[str]] = {}
    gpu_devices = {d["name"] for d in status["devices"] if d["kind"] == "nvidia"}
    for i, svc in enumerate(status["services"]):
        if svc["device"] in gpu_devices and svc["state"] == "loaded":
            pid = FAKE_PID_BASE + i
            processes[pid] = int(ledger_bytes(svc) * FAKE_SKEW)
            owners[pid] = [svc["name"]]
    return processes, owners


# -- configs --------------------------------------------------------------------------------


def gpu_config(data_dir: Path, llama_server: str | None) -> dict[str, Any]:
    """The default stack with its GPU services on ``nvidia`` device 0, and ``big``: a
    llama-server on the same GPU serving the chat model's GGUF file."""
    from accelmux.models.assets import smollm2_gguf_path

    data = stack_config(data_dir)
    data["devices"]["gpu"] = {"kind": "nvidia", "index": 0, "headroom": "1GiB"}
    for name in GPU_SERVICES:
        data["services"][name]["device"] = "gpu"
    for svc in data["services"].values():
        svc.setdefault("device", "host")
    if llama_server:
        data["services"]["big"] = {
            "kind": "chat",
            "class": "interactive",
            "residency": "warm",
            "device": "gpu",
            "model": "big",
            "memory": dict(data["services"]["chat"]["memory"]),
            "backend": {
                "type": "external",
                "argv": [
                    llama_server,
                    "-m",
                    str(smollm2_gguf_path()),
                    "--host",
                    "{host}",
                    "--port",
                    "{port}",
                    "--ctx-size",
                    "{ctx_size}",
                    "--parallel",
                    "{parallel}",
                    "-ngl",
                    "99",
                    "--metrics",
                ],
                "health_path": "/health",
                "metrics_path": "/metrics",
                "slots_path": "/slots",
                "startup_timeout_s": 120,
            },
        }
    return data


def fake_config(data_dir: Path) -> dict[str, Any]:
    """The fake stack (fake backends: no model) on an ``nvidia`` device."""
    fake = {"type": "fake", "latency_s": 0.0, "load_s": 0.0, "scale": 0.001}
    llm = {
        "weights": "512MiB",
        "kv_per_token": "64KiB",
        "kv_floor": "64MiB",
        "kv_ceiling": "256MiB",
    }
    return {
        "devices": {"gpu": {"kind": "nvidia", "index": 0, "capacity": "16GiB"}},
        "services": {
            "chat": {
                "kind": "chat",
                "class": "realtime",
                "memory": llm,
                "backend": {**fake, "stream_chunk_s": 0.002},
            },
            "big": {
                "kind": "chat",
                "memory": {**llm, "weights": "1GiB"},
                "backend": {**fake, "stream_chunk_s": 0.002},
            },
            "completion": {"kind": "completion", "memory": llm, "backend": fake},
            "embeddings": {"kind": "embeddings", "memory": {"weights": "64MiB"}, "backend": fake},
            "tts": {
                "kind": "tts",
                "class": "realtime",
                "memory": {"weights": "32MiB"},
                "backend": fake,
            },
            "asr": {
                "kind": "asr",
                "class": "realtime",
                "memory": {"weights": "64MiB"},
                "backend": fake,
            },
        },
        "server": {"data_dir": str(data_dir), "sample_interval_s": 0.5, "drain_s": 2.0},
    }


# -- load -----------------------------------------------------------------------------------


def _wav_16k(data: bytes) -> bytes:
    """The TTS answer as a WAV file ASR takes (any rate: the worker resamples)."""
    if data[:4] == b"RIFF":
        return data
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(data or b"\x00\x00" * 16000)
    return buf.getvalue()


def voice_chain(daemon: Daemon, chat_model: str) -> float:
    """TTS -> ASR -> a streamed chat reply; seconds."""
    client = daemon.openai()
    started = time.perf_counter()
    audio = client.audio.speech.create(model="tts", voice="alloy", input=SENTENCE).read()
    text = client.audio.transcriptions.create(
        model="asr", file=("q.wav", _wav_16k(audio), "audio/wav")
    ).text
    stream = client.chat.completions.create(
        model=chat_model,
        messages=[{"role": "user", "content": text or SENTENCE}],
        max_tokens=24,
        stream=True,
    )
    for _ in stream:
        pass
    return time.perf_counter() - started


@contextlib.contextmanager
def background_load(daemon: Daemon, llms: dict[str, str], errors: list[str]) -> Iterator[None]:
    """Streams on ``llms`` (name -> kind: chat or completion) and embedding calls, each
    in a loop of its own."""
    stop = threading.Event()

    def loop(call: Callable[[], None]) -> None:
        while not stop.is_set():
            try:
                call()
            except Exception as exc:  # every failure is counted, none stops the check
                errors.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.2)

    def chat(model: str) -> Callable[[], None]:
        def call() -> None:
            if llms[model] == "completion":
                for _ in daemon.openai().completions.create(
                    model=model, prompt="Once upon a time", max_tokens=64, stream=True
                ):
                    pass
                return
            stream = daemon.openai().chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "Tell me a short story."}],
                max_tokens=64,
                stream=True,
                stream_options={"include_usage": True},
            )
            for _ in stream:
                pass

        return call

    def embed() -> None:
        daemon.openai().embeddings.create(model="embeddings", input=[SENTENCE] * 16)

    threads = [threading.Thread(target=loop, args=(chat(m),), daemon=True) for m in llms]
    threads.append(threading.Thread(target=loop, args=(embed,), daemon=True))
    for t in threads:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)


def time_chains(daemon: Daemon, n: int, chat_model: str, errors: list[str]) -> list[float]:
    out = []
    for _ in range(n):
        try:
            out.append(voice_chain(daemon, chat_model))
        except Exception as exc:
            errors.append(f"voice chain: {type(exc).__name__}: {exc}")
    return out


# -- the run --------------------------------------------------------------------------------


def run_check(args: argparse.Namespace) -> dict[str, Any]:
    fake = bool(args.fake_nvml)
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    state = tmp / "fake_nvml.json"
    saved_env = dict(os.environ)
    if fake:
        write_fake_state(state, {}, {})
        os.environ["ACCELMUX_FAKE_NVML"] = str(state)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(FAKE_NVML_DIR), str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p
        )
        sys.path.insert(0, str(FAKE_NVML_DIR))
        sys.modules.pop("pynvml", None)
        config = fake_config(tmp / "data")
    else:
        config = gpu_config(tmp / "data", args.llama_server)
    llms = {
        n: str(s["kind"])
        for n, s in config["services"].items()
        if s["kind"] in ("chat", "completion")
    }
    errors: list[str] = []
    try:
        with run_daemon(config, tmp, timeout=120) as daemon:
            for name in config["services"]:
                daemon.post(f"/admin/services/{name}/load")
            daemon.wait_loaded(*config["services"], timeout=args.load_timeout)
            if fake:  # what the fake GPU holds: one process per fake service
                write_fake_state(state, *fake_processes(daemon.status()))
            chat_model = "voice" if "voice" in json.dumps(config["services"]["chat"]) else "chat"
            alone = time_chains(daemon, args.chains, chat_model, errors)
            others = {m: k for m, k in llms.items() if m != "chat"}
            with background_load(daemon, others, errors):
                loaded = time_chains(daemon, args.chains, chat_model, errors)
            daemon.wait(lambda: _sampled(daemon), timeout=30, what="a GPU memory sample")
            status = daemon.status()
            if fake:
                write_fake_state(state, *fake_processes(status))
            nvml = nvml_snapshot(0)
            owners = owners_from_status(status)
            if fake:
                owners = {int(p): n for p, n in _fake_owners(state).items()}
            log = daemon.log()
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
    return {
        "meta": run_meta(
            {
                "mode": "fake-nvml" if fake else "gpu",
                "chains": args.chains,
                "fake_skew": FAKE_SKEW if fake else None,
            }
        ),
        "gpu": {k: nvml[k] for k in ("name", "total_bytes", "used_bytes")},
        "processes": process_rows(status, nvml["processes"], owners),
        "services": service_rows(status),
        "ooms": count_ooms(errors, status, log),
        "errors": errors[:20],
        "voice": {
            "chains_alone": len(alone),
            "chains_loaded": len(loaded),
            "p95_alone_s": p95(alone),
            "p95_loaded_s": p95(loaded),
            "p50_alone_s": round(statistics.median(alone), 4) if alone else None,
            "p50_loaded_s": round(statistics.median(loaded), 4) if loaded else None,
        },
        "ttft": ttft_rows(status),
        "seconds": round(time.perf_counter() - started, 1),
        "build_seconds": args.build_seconds,
    }


def _sampled(daemon: Daemon) -> bool:
    devices = daemon.status()["devices"]
    return any(d["kind"] == "nvidia" and d.get("measured") for d in devices)


def _fake_owners(state: Path) -> dict[str, list[str]]:
    return dict(json.loads(state.read_text(encoding="utf-8"))["owners"])


def _pct(value: float | None) -> str:
    return "n/a (nothing measured)" if value is None else f"{value:+.2f} %"


def render(result: dict[str, Any]) -> str:
    """The report a person reads (the JSON has it all)."""
    lines = [f"GPU: {result['gpu']['name']} ({result['gpu']['total_bytes'] / GIB:.1f} GiB)"]
    lines.append("per process: ledger (+ worker overhead) vs NVML")
    for row in result["processes"]:
        lines.append(
            f"  pid {row['pid']:>7} {','.join(row['services']):<32} "
            f"ledger {row['ledger_bytes'] / MIB:9.1f} MiB + overhead "
            f"{row['overhead_bytes'] / MIB:7.1f} MiB  nvml {row['nvml_bytes'] / MIB:9.1f} MiB  "
            f"error {_pct(row['error_pct'])}"
        )
    lines.append("per service: ledger vs attributed")
    for row in result["services"]:
        lines.append(
            f"  {row['service']:<12} {row['accelerator'] or '-':<40} "
            f"ledger {row['ledger_bytes'] / MIB:9.1f} MiB  measured "
            f"{(row['measured_bytes'] or 0) / MIB:9.1f} MiB  error {_pct(row['error_pct'])}"
        )
    voice = result["voice"]
    lines.append(f"OOMs: {result['ooms']} (must be 0)")
    lines.append(f"voice p95: loaded {voice['p95_loaded_s']} s, alone {voice['p95_alone_s']} s")
    for name, row in result["ttft"].items():
        lines.append(f"TTFT {name}: p50 {row['ttft_p50_s']} s, p95 {row['ttft_p95_s']} s")
    built = result.get("build_seconds")
    lines.append(
        f"took {result['seconds']} s" + (f" after {built:.0f} s of build" if built else "")
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fake-nvml", action="store_true", help="fake stack and fake NVML")
    parser.add_argument(
        "--no-build", action="store_true", help="build nothing (scripts/gpu-check reads it)"
    )
    parser.add_argument("--llama-server", help="a CUDA llama-server binary (service big)")
    parser.add_argument("--chains", type=int, default=20, help="voice chains alone and loaded")
    parser.add_argument("--load-timeout", type=float, default=240.0)
    parser.add_argument(
        "--build-seconds", type=float, help="how long scripts/gpu-check's build took"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.chains < 1:
        parser.error("--chains must be at least 1")
    result = run_check(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(render(result))
    print(f"wrote {args.out}")
    return 1 if result["ooms"] else 0


if __name__ == "__main__":
    sys.exit(main())
