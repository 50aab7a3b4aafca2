"""Sentence embeddings with all-MiniLM-L6-v2 (int8 ONNX)."""

from __future__ import annotations

import math

import pytest

from accelmux.errors import RequestError
from accelmux.models import MiniLmEmbedder, cosine

pytestmark = pytest.mark.real


def test_similar_sentences_are_closer_than_unrelated_ones(embedder: MiniLmEmbedder) -> None:
    a, b, c, d = embedder.embed(
        [
            "A man is playing a guitar.",
            "Someone plays an acoustic guitar.",
            "The stock market fell sharply today.",
            "Shares dropped steeply on the exchange this morning.",
        ]
    )
    assert len(a) == embedder.dim == 384
    assert cosine(a, b) > cosine(a, c) + 0.3
    assert cosine(a, b) > cosine(a, d)
    assert cosine(c, d) > cosine(c, b) + 0.3
    for v in (a, b, c, d):
        assert math.isclose(math.sqrt(sum(x * x for x in v)), 1.0, rel_tol=1e-4)


def test_a_text_embeds_the_same_alone_and_in_a_padded_batch(embedder: MiniLmEmbedder) -> None:
    texts = ["short", "a somewhat longer sentence about the kitchen lights", "word " * 400, ""]
    batch = embedder.embed(texts)
    for text, vector in zip(texts, batch, strict=True):
        alone = embedder.embed([text])[0]
        assert cosine(alone, vector) > 0.9999


def test_batches_keep_their_order(embedder: MiniLmEmbedder) -> None:
    texts = [f"item {i} " + "padding " * (i * 7 % 50) for i in range(40)]
    batch = embedder.embed_array(texts)
    assert batch.shape == (40, 384)
    for i in (0, 13, 39):
        assert cosine(list(batch[i]), embedder.embed([texts[i]])[0]) > 0.9999
    assert embedder.embed([]) == []


def test_long_text_is_truncated(embedder: MiniLmEmbedder) -> None:
    assert embedder.count_tokens("word " * 400) > embedder.max_length
    assert len(embedder.embed(["word " * 400])[0]) == 384


@pytest.mark.parametrize("bad", ["just a string", [1, 2], [None]])
def test_bad_input_is_a_request_error(embedder: MiniLmEmbedder, bad: object) -> None:
    with pytest.raises(RequestError):
        embedder.embed(bad)  # type: ignore[arg-type]
