"""llama-cpp-python is used only at the version whose internals accelmux reaches into.

``accelmux.models.llama_adapter`` holds every access to llama-cpp-python's private fields
(pause, park, resize); another release fails loudly at its first use instead of
misbehaving in a pause or a resize.
"""

from __future__ import annotations

import pytest

from accelmux.errors import BackendError
from accelmux.models import LlamaTextModel, llama_adapter

from .support import LLAMA, SMOLLM2, need

pytestmark = pytest.mark.real


def test_the_installed_runtime_is_the_supported_one() -> None:
    need(LLAMA)
    assert llama_adapter.runtime().__version__ == llama_adapter.SUPPORTED_VERSION


def test_another_version_fails_loudly_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    need(LLAMA, SMOLLM2)
    import llama_cpp

    monkeypatch.setattr(llama_cpp, "__version__", "0.3.2")
    monkeypatch.setattr(llama_adapter, "_checked", set())
    model = LlamaTextModel.smollm2(n_ctx=256)
    with pytest.raises(BackendError) as err:
        model.load()
    assert str(err.value) == (
        f"llama-cpp-python 0.3.2 is installed; accelmux supports "
        f"{llama_adapter.SUPPORTED_VERSION} (scripts/setup-models.sh installs it)"
    )
    assert not model.loaded
