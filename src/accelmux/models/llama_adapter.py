"""The one place that reaches into llama-cpp-python's internals.

Pausing, parking and resizing a llama.cpp model need more than llama-cpp-python's public
API: the ``llama_model`` and ``llama_context`` a ``Llama`` keeps (``Llama._model``,
``Llama._ctx``: ``_internals.LlamaModel`` / ``LlamaContext``), its sampler chain
(``Llama._sampler``), its per-context buffers (``_batch``, ``_n_ctx``, ``_n_vocab``,
``_candidates``, ``_logits_all``), its per-sequence fields (``_requires_eval``,
``_mirostat_mu``) and a ``LlamaGrammar``'s source (``_grammar``, ``_root``). These are
private and change between releases, so every access goes through this module, and the
runtime is used only at the version these functions were written against:
:data:`SUPPORTED_VERSION`. Another version fails loudly at its first import (see
:func:`runtime`) instead of misbehaving in a pause or a resize.

``scripts/setup-models.sh`` installs this version (built with portable CPU flags); the
``llama`` extra of ``pyproject.toml`` pins it too.
"""

from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Any

from accelmux.errors import BackendError
from accelmux.models._deps import require

LLAMA_PACKAGE = "llama-cpp-python"
#: The llama-cpp-python release whose internals this module was written against.
SUPPORTED_VERSION = "0.3.36"

_checked: set[str] = set()


def unsupported_version(installed: str) -> str | None:
    """The error message for an ``installed`` llama-cpp-python version, or None when it
    is :data:`SUPPORTED_VERSION`."""
    if installed == SUPPORTED_VERSION:
        return None
    return (
        f"{LLAMA_PACKAGE} {installed} is installed; accelmux supports {SUPPORTED_VERSION} "
        "(scripts/setup-models.sh installs it)"
    )


def check_version(module: ModuleType) -> None:
    """Raise :class:`BackendError` unless ``module`` (``llama_cpp``) is the supported
    release."""
    installed = str(getattr(module, "__version__", "unknown"))
    problem = unsupported_version(installed)
    if problem is not None:
        raise BackendError(problem)


def runtime() -> ModuleType:
    """``llama_cpp``, imported and checked to be :data:`SUPPORTED_VERSION`."""
    module = require("llama_cpp", LLAMA_PACKAGE)
    installed = str(getattr(module, "__version__", "unknown"))
    if installed not in _checked:
        check_version(module)
        _checked.add(installed)
    return module


def internals() -> ModuleType:
    """``llama_cpp._internals`` (``LlamaContext``, ``LlamaBatch``) of the checked runtime."""
    runtime()
    return require("llama_cpp._internals", LLAMA_PACKAGE)


def chat_format() -> ModuleType:
    """``llama_cpp.llama_chat_format`` of the checked runtime."""
    runtime()
    return require("llama_cpp.llama_chat_format", LLAMA_PACKAGE)


# --- the model and its context -------------------------------------------------------


def model(llm: Any) -> Any:
    """``llm``'s ``_internals.LlamaModel`` (the weights)."""
    return llm._model


def n_vocab(llm: Any) -> int:
    """The size of ``llm``'s vocabulary (as ``Llama`` keeps it)."""
    return int(llm._n_vocab)


def vocab(llm: Any) -> Any:
    """``llm``'s ``llama_vocab`` pointer (what a grammar sampler is built on)."""
    return llm._model.vocab


def token_text(llm: Any, token: int) -> str:
    """The text of ``token`` in ``llm``'s vocabulary."""
    return str(llm._model.token_get_text(token))


def context_pointer(llm: Any) -> Any:
    """``llm``'s raw ``llama_context`` pointer (for the ``llama_state_seq_*`` calls)."""
    return llm._ctx.ctx


def clear_kv(llm: Any) -> None:
    """Remove every cell of every sequence from ``llm``'s KV cache."""
    llm._ctx.kv_cache_seq_rm(-1, 0, -1)


# --- per-sequence fields --------------------------------------------------------------


def sampler(llm: Any) -> Any:
    """``llm``'s sampler chain (``LlamaSampler``; None until its first sample)."""
    return llm._sampler


def set_sampler(llm: Any, chain: Any) -> None:
    """Make ``chain`` ``llm``'s sampler chain (None: a new one at the next sample)."""
    llm._sampler = chain


def requires_eval(llm: Any) -> bool:
    """Whether ``llm`` must evaluate its last token before it samples again."""
    return bool(getattr(llm, "_requires_eval", False))


def set_requires_eval(llm: Any, value: bool) -> None:
    if hasattr(llm, "_requires_eval"):
        llm._requires_eval = value


def mirostat_mu(llm: Any) -> Any:
    """``llm``'s mirostat state (None when it has none)."""
    return getattr(llm, "_mirostat_mu", None)


def set_mirostat_mu(llm: Any, value: Any) -> None:
    if value is not None:
        llm._mirostat_mu = value


def grammar_source(grammar: Any) -> tuple[str, str]:
    """A ``LlamaGrammar``'s GBNF text and root rule (to build an equal one again)."""
    return str(grammar._grammar), str(grammar._root)


# --- whole-object operations (unload with paused streams, reload, resize) -------------


def strip(llm: Any) -> None:
    """Drop what a closed ``Llama`` sizes per context (kept only for paused streams)."""
    np = require("numpy", "numpy")
    llm.input_ids = np.ndarray((0,), dtype=np.intc)
    llm.scores = np.ndarray((0, llm._n_vocab), dtype=np.single)
    llm._candidates = None
    llm._sampler = None


def adopt(shell: Any, fresh: Any) -> None:
    """Make ``shell`` (a closed ``Llama`` paused generators are bound to) the freshly
    loaded ``fresh``: it takes all of ``fresh``'s state (model, context, batch, buffers),
    and ``fresh`` is left with nothing to free. The generators read every field through
    ``self``, so they find the new model and context."""
    state = dict(fresh.__dict__)
    fresh.__dict__.clear()
    fresh._stack = contextlib.ExitStack()  # its __del__ closes nothing
    shell.__dict__.clear()
    shell.__dict__.update(state)


def swap_context(llm: Any, n_ctx: int, n_batch: int, n_ubatch: int) -> None:
    """Replace ``llm``'s llama_context with a new one of ``n_ctx`` cells, same llama_model."""
    llama_internals = internals()
    np = require("numpy", "numpy")
    params = llm.context_params
    old_params = (params.n_ctx, params.n_batch, params.n_ubatch)
    batch = min(n_ctx, n_batch)
    params.n_ctx, params.n_batch, params.n_ubatch = n_ctx, batch, min(batch, n_ubatch)
    try:
        new_ctx = llama_internals.LlamaContext(model=llm._model, params=params, verbose=False)
    except BaseException:
        params.n_ctx, params.n_batch, params.n_ubatch = old_params
        raise
    new_batch = llama_internals.LlamaBatch(n_tokens=batch, embd=0, n_seq_max=n_ctx, verbose=False)
    old_ctx, old_batch = llm._ctx, llm._batch
    llm._ctx, llm._batch = new_ctx, new_batch
    old_ctx.close()
    old_batch.close()
    llm.n_batch = batch
    llm._n_ctx = int(new_ctx.n_ctx())
    llm.input_ids = np.ndarray((llm._n_ctx,), dtype=np.intc)
    rows = llm._n_ctx if llm._logits_all else batch
    llm.scores = np.ndarray((rows, llm._n_vocab), dtype=np.single)
    llm.n_tokens = 0
    llm._sampler = None
    set_requires_eval(llm, True)
