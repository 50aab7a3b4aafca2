"""Finding the llama-server binary that scripts/setup-llama-server.sh builds, and a config
that supervises it with the packaged SmolLM2 GGUF."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from accelmux.errors import BackendError
from accelmux.models.assets import smollm2_gguf_path

SETUP = "scripts/setup-llama-server.sh"
VERSION = os.environ.get("ACCELMUX_LLAMA_CPP_VERSION", "0.3.36")


def llama_server_path() -> Path:
    """``$ACCELMUX_LLAMA_SERVER``, else the cached build. Missing: the test fails, naming
    the setup script, unless ``ACCELMUX_SKIP_MODELS=1`` (then it skips)."""
    explicit = os.environ.get("ACCELMUX_LLAMA_SERVER")
    cache = Path(os.environ.get("ACCELMUX_WHEEL_CACHE", Path.home() / ".cache" / "accelmux-wheels"))
    path = Path(explicit) if explicit else cache / f"llama-server-{VERSION}" / "llama-server"
    if path.is_file() and os.access(path, os.X_OK):
        return path
    why = f"llama-server not found at {path}; build it with {SETUP}"
    if os.environ.get("ACCELMUX_SKIP_MODELS") == "1":
        pytest.skip(why)
    pytest.fail(why)


def smollm2() -> Path:
    try:
        return smollm2_gguf_path()
    except BackendError as exc:
        if os.environ.get("ACCELMUX_SKIP_MODELS") == "1":
            pytest.skip(str(exc))
        pytest.fail(f"{exc}; run scripts/setup-models.sh")


def llama_service(binary: Path, model: Path, **backend: Any) -> dict[str, Any]:
    """A chat service run by llama-server, sized from the GGUF (weights, KV per token)."""
    return {
        "kind": "chat",
        "concurrency": 2,
        "memory": {
            "gguf": str(model),
            "kv_floor": "16MiB",
            "kv_ceiling": "32MiB",
            "workspace": "16MiB",
        },
        "backend": {
            "type": "external",
            "argv": [
                str(binary),
                "-m",
                str(model),
                "--host",
                "{host}",
                "--port",
                "{port}",
                "-c",
                "{ctx_size}",
                "-np",
                "{parallel}",
                "-t",
                "2",
                "-b",
                "256",
                "--metrics",
                "--no-warmup",
            ],
            "metrics_path": "/metrics",
            "slots_path": "/slots",
            "startup_timeout_s": 120,
            "stop_grace_s": 5,
            **backend,
        },
    }


def llama_config(binary: Path, model: Path) -> dict[str, Any]:
    return {
        "devices": {"cpu": {"kind": "virtual", "capacity": "2GiB", "headroom": "128MiB"}},
        "services": {"chat": llama_service(binary, model)},
        "policy": {"crash_backoff_s": 0.2, "crash_backoff_max_s": 1.0},
        "server": {"drain_s": 2.0, "sample_interval_s": 0.5},
    }
