"""Without the runtimes, accelmux.models imports and a load names the missing package."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.real

BLOCK = """
import sys
for name in ("llama_cpp", "onnxruntime", "tokenizers", "piper", "pocketsphinx", "cv2", "numpy"):
    sys.modules[name] = None  # makes "import name" fail
import accelmux.models as m
from accelmux.errors import BackendError
cases = [
    (lambda: m.LlamaTextModel("/nonexistent.gguf").load(), "llama-cpp-python"),
    (lambda: m.MiniLmEmbedder(model_path="x", tokenizer_path="y").load(), "onnxruntime"),
    (lambda: m.PiperSpeaker(model_path="x", config_path="y").load(), "piper-tts"),
    (lambda: m.PocketsphinxRecognizer(hmm="a", lm="b", dict_path="c").load(), "pocketsphinx"),
    (lambda: m.OpenCvDetector(cascade_path="x").load(), "opencv-python-headless"),
    (lambda: list(m.FrameReader("x.mp4")), "opencv-python-headless"),
]
for call, package in cases:
    try:
        call()
    except BackendError as exc:
        assert package in str(exc), str(exc)
        assert "scripts/setup-models.sh" in str(exc), str(exc)
    else:
        raise AssertionError(f"no error for {package}")
print("ok")
"""


def test_missing_runtimes_raise_backend_errors_naming_the_package() -> None:
    out = subprocess.run(
        [sys.executable, "-c", BLOCK], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
