"""The default stack: what ``accelmux serve`` runs when given no config.

Every service runs a real model from a PyPI package (``scripts/setup-models.sh``) in
the one shared inference worker, on the host device (this machine's RAM, as a
shared-memory accelerator would use it). The budget and headroom come from the RAM
(:func:`host_budget`); LLM memory profiles come from the GGUF headers; the others from
the measurements in docs/models.md. :func:`default_config_data` builds the config as
plain data (``accelmux serve --show-config`` prints it as YAML, a starting point for
your own file).

=============  ===========  ==========  =========  ================================
service        kind         class       residency  model
=============  ===========  ==========  =========  ================================
chat           chat         realtime    pinned     SmolLM2-135M-Instruct (llama.cpp)
completion     completion   interactive warm       Gemma 3 270M base (llama.cpp)
embeddings     embeddings   interactive warm       all-MiniLM-L6-v2 (onnxruntime)
indexer        embeddings   batch       warm       the same MiniLM copy, shared
tts            tts          realtime    pinned     Piper en_US-joe-medium
asr            asr          realtime    pinned     PocketSphinx en-US
detect         detect       interactive warm       OpenCV Haar face + HOG person
camera         camera       background  warm       the same OpenCV copy, shared
=============  ===========  ==========  =========  ================================

The voice chain (asr -> chat -> tts) is realtime and pinned: always loaded, and while
it runs no batch or background work starts. ``indexer`` runs batch jobs (``/v1/jobs``)
inside a nightly maintenance window (22:00-07:00), and outside it only with spare memory
and no higher class waiting. ``camera`` analyses the sample clip
written into the data directory at first use, one frame per second.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psutil

from accelmux.core.types import GIB, MIB
from accelmux.models.assets import gemma3_gguf_path, smollm2_gguf_path
from accelmux.models.gguf_profile import gguf_profile, llama_memory_estimate

#: Context sizes (tokens) of the LLMs' KV pools: floor (idle) and ceiling (ballooned).
KV_FLOOR_TOKENS = 512
KV_CEILING_TOKENS = 4096
#: The nightly maintenance window of batch embedding jobs.
INDEX_WINDOW = "22:00-07:00"
#: Resident bytes of a runtime's first import in the worker (measured in the worker, where
#: numpy and the standard library are already loaded).
IMPORT_BYTES = {"llama": 8 * MIB, "onnxruntime": 34 * MIB, "sphinx": 33 * MIB, "cv2": 16 * MIB}


def host_budget(total: int) -> tuple[int, int]:
    """(budget, headroom) for a host with ``total`` bytes of RAM.

    The budget is a third of the RAM, at least 1.5 GiB and at most 8 GiB (never more than
    60 % of the RAM: the rest belongs to the system and its other programs); the headroom
    kept free for transient peaks is an eighth of the budget, at least 256 MiB.
    """
    budget = int(min(8 * GIB, max(1.5 * GIB, total / 3), total * 0.6))
    budget -= budget % (256 * MIB)  # a round number
    headroom = max(256 * MIB, budget // 8)
    return budget, headroom


def default_data_dir() -> Path:
    """``$ACCELMUX_DATA_DIR``, else ``$XDG_DATA_HOME/accelmux`` (``~/.local/share``)."""
    env = os.environ.get("ACCELMUX_DATA_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "accelmux"


def _llm_memory(path: Path, first_llm: bool) -> dict[str, Any]:
    profile = gguf_profile(path)
    estimate = llama_memory_estimate(profile, KV_FLOOR_TOKENS)
    runtime = estimate.runtime_bytes + estimate.output_bytes
    if first_llm:
        runtime += IMPORT_BYTES["llama"]
    return {
        "weights": profile.weights_bytes,
        "runtime": runtime,
        "kv_per_token": profile.kv_bytes_per_token,
        "kv_floor": profile.kv_bytes_per_token * KV_FLOOR_TOKENS,
        "kv_ceiling": profile.kv_bytes_per_token * KV_CEILING_TOKENS,
        "workspace": 8 * MIB,
    }


def default_config_data(
    *,
    total_ram: int | None = None,
    data_dir: Path | None = None,
    camera_source: str = "sample",
    camera_fps: float = 1.0,
) -> dict[str, Any]:
    """The default stack as config data (validate with ``load_config_data``)."""
    if total_ram is None:
        total_ram = int(psutil.virtual_memory().total)
    budget, headroom = host_budget(total_ram)
    hosted: dict[str, Any] = {"type": "worker"}
    # Services that share a loaded model each get its full estimate: either may carry the
    # copy alone (the one that loaded it first does; the other takes over when it goes).
    # While both hold it the ledger counts it once (``weights_key``), naming the sharer.
    minilm = {
        "weights": 160 * MIB,
        "runtime": 8 * MIB,
        "workspace": 64 * MIB,
        "per_unit": 256 * 1024,
    }
    opencv = {
        "weights": 4 * MIB,
        "runtime": IMPORT_BYTES["cv2"],
        "workspace": 8 * MIB,
        "per_unit": 24 * MIB,
    }
    services: dict[str, Any] = {
        "chat": {
            "kind": "chat",
            "class": "realtime",
            "residency": "pinned",
            "model": "smollm2",
            "aliases": ["chat", "voice"],
            "memory": _llm_memory(smollm2_gguf_path(), True),
            "queue": {"limit": 16, "deadline_s": 60},
            "backend": {**hosted, "options": {"model": "smollm2"}},
        },
        "completion": {
            "kind": "completion",
            "class": "interactive",
            "residency": "warm",
            "ttl_s": 600,
            "model": "gemma3",
            "aliases": ["completion"],
            "memory": _llm_memory(gemma3_gguf_path(), False),
            "backend": {**hosted, "options": {"model": "gemma3"}},
        },
        "embeddings": {
            "kind": "embeddings",
            "class": "interactive",
            "residency": "warm",
            "ttl_s": 900,
            "model": "minilm",
            "aliases": ["embeddings", "all-MiniLM-L6-v2"],
            "memory": dict(minilm),
            "backend": hosted,
        },
        "indexer": {
            "kind": "embeddings",
            "class": "batch",
            "residency": "warm",
            "ttl_s": 300,
            "windows": [INDEX_WINDOW],
            "memory": dict(minilm),
            "queue": {"limit": 64, "deadline_s": 3600},
            "backend": hosted,
        },
        "tts": {
            "kind": "tts",
            "class": "realtime",
            "residency": "pinned",
            "model": "piper",
            "aliases": ["tts", "tts-1", "en_US-joe-medium"],
            "memory": {
                "weights": 92 * MIB,
                "runtime": IMPORT_BYTES["onnxruntime"],
                "workspace": 160 * MIB,
            },
            "backend": hosted,
        },
        "asr": {
            "kind": "asr",
            "class": "realtime",
            "residency": "pinned",
            "model": "pocketsphinx",
            "aliases": ["asr", "whisper-1"],
            "memory": {
                "weights": 92 * MIB,
                "runtime": 16 * MIB,
                "workspace": 16 * MIB,
                "per_unit": 256 * 1024,
            },
            "backend": hosted,
        },
        "detect": {
            "kind": "detect",
            "class": "interactive",
            "residency": "warm",
            "ttl_s": 900,
            "model": "opencv",
            "aliases": ["detect"],
            "memory": dict(opencv),
            "backend": hosted,
        },
        "camera": {
            "kind": "camera",
            "class": "background",
            "residency": "warm",
            "memory": dict(opencv),
            "queue": {"limit": 2, "deadline_s": 30},
            "backend": {**hosted, "options": {"source": camera_source, "fps": camera_fps}},
        },
    }
    return {
        "devices": {"host": {"kind": "host", "budget": budget, "headroom": headroom}},
        "services": services,
        "server": {"data_dir": str(data_dir or default_data_dir())},
    }


def summary(data: dict[str, Any], total_ram: int) -> str:
    """The line ``accelmux serve`` prints at start."""
    dev = data["devices"]["host"]
    names = {
        "chat": "SmolLM2",
        "completion": "Gemma3-270M",
        "embeddings": "MiniLM",
        "indexer": "MiniLM, shared",
        "tts": "Piper",
        "asr": "PocketSphinx",
        "detect": "OpenCV",
        "camera": "OpenCV, shared",
    }
    services = ", ".join(
        f"{name}({names.get(name, svc['kind'])})" for name, svc in data["services"].items()
    )
    return (
        f"device host: {total_ram / GIB:.1f} GiB RAM, budget {int(dev['budget']) / GIB:.1f} GiB, "
        f"headroom {int(dev['headroom']) / GIB:.1f} GiB; services: {services}"
    )
