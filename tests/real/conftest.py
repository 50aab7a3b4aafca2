"""Shared, loaded models for the real-model tests (each loaded once per test session)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from accelmux.models import (
    LlamaTextModel,
    MiniLmEmbedder,
    OpenCvDetector,
    PiperSpeaker,
    PocketsphinxRecognizer,
)

from .support import (
    CV2,
    GEMMA3,
    JOE,
    LLAMA,
    MINILM,
    MINILM_TOKENIZER,
    ORT,
    PIPER,
    SMOLLM2,
    SPHINX,
    TOKENIZERS,
    need,
)


@pytest.fixture(scope="session")
def smollm2() -> Iterator[LlamaTextModel]:
    need(LLAMA, SMOLLM2)
    model = LlamaTextModel.smollm2(n_ctx=1024)
    model.load()
    yield model
    model.unload()


@pytest.fixture(scope="session")
def gemma3() -> Iterator[LlamaTextModel]:
    need(LLAMA, GEMMA3)
    model = LlamaTextModel.gemma3(n_ctx=512)
    model.load()
    yield model
    model.unload()


@pytest.fixture(scope="session")
def embedder() -> Iterator[MiniLmEmbedder]:
    need(ORT, TOKENIZERS, MINILM, MINILM_TOKENIZER)
    model = MiniLmEmbedder()
    model.load()
    yield model
    model.unload()


@pytest.fixture(scope="session")
def speaker() -> Iterator[PiperSpeaker]:
    need(PIPER, JOE)
    model = PiperSpeaker()
    model.load()
    yield model
    model.unload()


@pytest.fixture(scope="session")
def recognizer() -> Iterator[PocketsphinxRecognizer]:
    need(SPHINX)
    model = PocketsphinxRecognizer()
    model.load()
    yield model
    model.unload()


@pytest.fixture(scope="session")
def detector() -> Iterator[OpenCvDetector]:
    need(CV2)
    model = OpenCvDetector()
    model.load()
    yield model
    model.unload()


def pytest_unconfigure(config: pytest.Config) -> None:
    # llama_cpp._utils opens two /dev/null files at import and never closes them, which
    # prints a ResourceWarning at interpreter exit; every Llama is closed by now.
    utils = sys.modules.get("llama_cpp._utils")
    for name in ("outnull_file", "errnull_file"):
        handle = getattr(utils, name, None)
        if handle is not None:
            handle.close()
