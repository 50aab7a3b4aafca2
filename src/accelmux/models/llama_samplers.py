"""What a llama.cpp sampler chain holds, and whether it may outlive its model.

``Llama._sampler`` (llama-cpp-python's ``LlamaSampler``) wraps one ``llama_sampler``
chain. Its samplers keep their state in host memory: the ``dist`` sampler its seeded
``std::mt19937`` (llama.cpp exposes the seed, ``llama_sampler_get_seed``, but not the
generator's state), ``penalties`` its ring of recent tokens, ``mirostat`` its mu. None of
these points into a ``llama_model`` or a ``llama_context``: the context is passed to
``llama_sampler_sample`` on every call, so such a chain keeps working, state and all,
after its model was freed and loaded again. A few samplers keep a pointer to the model's
vocabulary (``grammar``, ``dry``, ``infill``): once that model is freed they would read
freed memory, so a chain holding one may not be used with another copy of the model.
A grammar can be grown again (:func:`detach_grammar`): its state is a function of the
grammar's text and of the tokens it accepted, both known.
"""

from __future__ import annotations

from typing import Any

from accelmux.models import llama_adapter

#: Samplers whose state is theirs alone (no pointer into a model or a context).
SELF_CONTAINED = frozenset(
    {
        "dist",
        "greedy",
        "logit-bias",
        "min-p",
        "mirostat",
        "mirostat-v2",
        "penalties",
        "temp",
        "temp-ext",
        "top-k",
        "top-n-sigma",
        "top-p",
        "typical",
        "xtc",
    }
)


def sampler_names(sampler: Any) -> list[str]:
    """The names of the samplers in ``sampler``'s chain, in order (``custom`` for a
    Python callback). llama.cpp marks some names with a leading ``?``; it is dropped."""
    chain = getattr(sampler, "sampler", None)
    if chain is None:
        return []
    llama_cpp = llama_adapter.runtime()
    custom = {int(i) for i, _ in getattr(sampler, "custom_samplers", ())}
    names = []
    for i in range(int(llama_cpp.llama_sampler_chain_n(chain))):
        if i in custom:
            names.append("custom")
            continue
        raw = llama_cpp.llama_sampler_name(llama_cpp.llama_sampler_chain_get(chain, i))
        names.append((raw or b"?").decode("utf-8", "replace").lstrip("?") or "unnamed")
    return names


def model_bound(sampler: Any) -> list[str]:
    """The samplers of ``sampler``'s chain that may point into its model (or that this
    module does not know): empty when the chain may outlive the model."""
    return [name for name in sampler_names(sampler) if name not in SELF_CONTAINED]


def detach_grammar(sampler: Any, grammar: Any, n_prompt: int, llm: Any) -> Any:
    """Take the grammar sampler out of ``sampler``'s chain before its model goes (it
    points into the model's vocabulary) and free it; returns a :class:`RegrownGrammar`
    that puts an equal one back on its first use. None when the chain holds anything
    else bound to the model, or ``grammar`` (the ``LlamaGrammar`` the generation
    follows) is not known."""
    if grammar is None or getattr(sampler, "custom_samplers", None):
        return None
    names = sampler_names(sampler)
    if [n for n in names if n not in SELF_CONTAINED] != ["grammar"]:
        return None
    llama_cpp = llama_adapter.runtime()
    index = names.index("grammar")
    llama_cpp.llama_sampler_free(llama_cpp.llama_sampler_chain_remove(sampler.sampler, index))
    text, root = llama_adapter.grammar_source(grammar)
    return RegrownGrammar(sampler, index, text, root, n_prompt, llm)


class RegrownGrammar:
    """A sampler chain whose grammar sampler was freed with its model: on its first use
    (``Llama.sample`` calls ``Llama._sampler.sample(ctx, idx)``) a new grammar sampler is
    made on the model loaded now, fed every token sampled so far, and put back at its
    place in the chain; the other samplers are the same objects, their state (the RNG
    of ``dist``, the recent tokens of ``penalties``) untouched. Sampled so far means
    ``input_ids[n_prompt:n_tokens]`` then: ``Llama.generate`` evaluates the token it
    sampled last before it samples the next one."""

    def __init__(
        self, chain: Any, index: int, grammar: str, root: str, n_prompt: int, llm: Any
    ) -> None:
        self.chain = chain
        self.index = index
        self.grammar = grammar
        self.root = root
        self.n_prompt = n_prompt
        self.llm = llm
        self.regrown = False

    @property
    def sampler(self) -> Any:
        """The chain (without its grammar until regrown)."""
        return self.chain.sampler

    def sample(self, ctx: Any, idx: int = -1) -> int:
        chain = self.regrow()
        return int(chain.sample(ctx, idx))

    def regrow(self) -> Any:
        """Put a new grammar sampler into the chain; ``llm._sampler`` becomes the chain."""
        if self.regrown:
            return self.chain
        llama_cpp = llama_adapter.runtime()
        llm = self.llm
        grammar = llama_cpp.llama_sampler_init_grammar(
            llama_adapter.vocab(llm), self.grammar.encode("utf-8"), self.root.encode("utf-8")
        )
        if not grammar:
            raise RuntimeError("llama.cpp could not parse the grammar again")
        for token in llm.input_ids[self.n_prompt : llm.n_tokens]:
            llama_cpp.llama_sampler_accept(grammar, int(token))
        chain = self.chain.sampler
        n = int(llama_cpp.llama_sampler_chain_n(chain))
        tail = [
            llama_cpp.llama_sampler_chain_remove(chain, self.index) for _ in range(n - self.index)
        ]
        for sampler in (grammar, *tail):
            llama_cpp.llama_sampler_chain_add(chain, sampler)
        llama_adapter.set_sampler(llm, self.chain)
        self.regrown = True
        return self.chain
