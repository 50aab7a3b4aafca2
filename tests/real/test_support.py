from __future__ import annotations

import pytest

from .support import need, wer

pytestmark = pytest.mark.real


def test_wer_counts_substitutions_insertions_and_deletions() -> None:
    assert wer("the cat sat", "the cat sat") == 0.0
    assert wer("the cat sat", "the bat sat") == pytest.approx(1 / 3)
    assert wer("the cat sat", "the cat") == pytest.approx(1 / 3)
    assert wer("the cat sat", "the cat sat down") == pytest.approx(1 / 3)
    assert wer("Hello, World!", "hello world") == 0.0
    assert wer("", "") == 0.0


NOWHERE = ("accelmux_no_such_module_anywhere", "no-such-package")


def test_a_missing_model_fails_the_test_and_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ACCELMUX_SKIP_MODELS", raising=False)
    with pytest.raises(pytest.fail.Exception, match=r"no-such-package .*scripts/setup-models\.sh"):
        need(NOWHERE)


def test_a_missing_model_skips_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELMUX_SKIP_MODELS", "1")
    with pytest.raises(pytest.skip.Exception, match="no-such-package"):
        need(NOWHERE)
    monkeypatch.setenv("ACCELMUX_SKIP_MODELS", "0")
    with pytest.raises(pytest.fail.Exception):
        need(NOWHERE)


def test_an_installed_module_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCELMUX_SKIP_MODELS", raising=False)
    need(("json", "python"))
