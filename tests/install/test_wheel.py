"""The package alone is enough: build the wheel, install it into a new virtualenv outside
the checkout, ``accelmux setup``, ``accelmux serve``, and one request per modality.

The virtualenv sees nothing of the checkout (no ``PYTHONPATH``, its working directory
elsewhere); the llama.cpp wheel comes from the cache ``accelmux setup`` keeps (built
there by the suite's own setup step, or here on a first run: minutes).
"""

from __future__ import annotations

import base64
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.real.support import need
from tests.waiting import wait_until

from accelmux import __version__

from .support import ROOT, clean_env

pytestmark = [pytest.mark.real, pytest.mark.slow, pytest.mark.timeout(1500)]


def _run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 900) -> Any:
    return subprocess.run(
        argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def work() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="accelmux-wheel-test-"))  # outside the checkout
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _build_wheel(work: Path, env: dict[str, str]) -> Path:
    source = work / "source"
    shutil.copytree(
        ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    done = _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(work / "dist"), "."],
        env,
        source,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = (work / "dist").glob("accelmux-*.whl")
    return wheel


def _post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as resp:
        return json.load(resp)


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.load(resp)


def _answers(url: str) -> bool:
    try:
        _get(url)
    except OSError:
        return False
    return True


def test_the_wheel_installs_sets_up_and_serves_every_modality(work: Path) -> None:
    # what this test sends: a photograph, encoded here (the daemon's own come from setup)
    need(("cv2", "opencv-python-headless"), ("skimage", "scikit-image"), ("openai", "openai"))
    env = clean_env()
    wheel = _build_wheel(work, env)
    venv = work / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    assert _run([base, "-m", "venv", str(venv)], env, work).returncode == 0
    bin_dir = venv / "bin"
    done = _run([str(bin_dir / "pip"), "install", "-q", str(wheel)], env, work)
    assert done.returncode == 0, done.stderr[-3000:]
    accelmux = str(bin_dir / "accelmux")
    version = _run([accelmux, "--version"], env, work)
    assert version.stdout == f"accelmux {__version__}\n"
    # nothing of the stack yet: --check says what is missing and fails
    before = _run([accelmux, "setup", "--check"], env, work)
    assert before.returncode == 1 and "MISSING  runtimes import" in before.stdout, before.stdout
    env["ACCELMUX_MODEL_CACHE"] = str(work / "models")
    setup = _run([accelmux, "setup"], env, work)
    assert setup.returncode == 0, setup.stderr[-3000:]
    assert "== setup: all runtimes import" in setup.stderr
    after = _run([accelmux, "setup", "--check"], env, work)
    assert after.returncode == 0, after.stdout
    _serve_one_request_per_modality(accelmux, env, work)


def _serve_one_request_per_modality(accelmux: str, env: dict[str, str], work: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    url = f"http://127.0.0.1:{port}"
    env = dict(env, XDG_DATA_HOME=str(work / "xdg"))
    log = (work / "serve.log").open("w")
    proc = subprocess.Popen(
        [accelmux, "serve", "--port", str(port)], env=env, cwd=work, stdout=log, stderr=log
    )
    try:
        wait_until(
            lambda: proc.poll() is not None or _answers(url + "/v1/models"),
            timeout=300,
            message="the default stack to answer /v1/models",
        )
        assert proc.poll() is None, (work / "serve.log").read_text()[-3000:]
        _one_request_per_modality(url)
        server = _get(url + "/admin/status")["server"]
        assert server["version"] == __version__ and server["config"]["file"] == "default stack"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def _one_request_per_modality(url: str) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="unused", timeout=300)
    models = {m.id for m in client.models.list()}
    assert {"chat", "completion", "embeddings", "tts", "asr", "detect", "camera"} <= models
    chat = client.chat.completions.create(
        model="chat", max_tokens=8, messages=[{"role": "user", "content": "Say hi."}]
    )
    assert chat.choices[0].message.content
    completion = client.completions.create(model="completion", prompt="The sky is", max_tokens=4)
    assert completion.choices[0].text
    vectors = client.embeddings.create(model="embeddings", input=["a cat", "a kitten"])
    assert len(vectors.data) == 2 and len(vectors.data[0].embedding) == 384
    speech = client.audio.speech.create(model="tts", voice="alloy", input="The lights are on.")
    wav = speech.read()
    assert wav[:4] == b"RIFF"
    heard = client.audio.transcriptions.create(model="asr", file=("speech.wav", wav))
    assert isinstance(heard.text, str)
    import cv2
    import skimage.data

    ok, jpeg = cv2.imencode(".jpg", cv2.cvtColor(skimage.data.astronaut(), cv2.COLOR_RGB2BGR))
    assert ok
    image = base64.b64encode(jpeg.tobytes()).decode()
    found = _post(url + "/v1/detections", {"model": "detect", "image": image})
    assert any(d["label"] == "face" for d in found["detections"]), found
    cameras = _get(url + "/v1/cameras")
    assert any(c.get("name") == "camera" or c.get("id") == "camera" for c in cameras["data"])
    events = _get(url + "/v1/cameras/camera/events?limit=5")
    assert isinstance(events["data"], list)
