from __future__ import annotations

import pytest

from .support import wer

pytestmark = pytest.mark.real


def test_wer_counts_substitutions_insertions_and_deletions() -> None:
    assert wer("the cat sat", "the cat sat") == 0.0
    assert wer("the cat sat", "the bat sat") == pytest.approx(1 / 3)
    assert wer("the cat sat", "the cat") == pytest.approx(1 / 3)
    assert wer("the cat sat", "the cat sat down") == pytest.approx(1 / 3)
    assert wer("Hello, World!", "hello world") == 0.0
    assert wer("", "") == 0.0
