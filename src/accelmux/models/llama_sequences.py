"""Pausing a llama.cpp generation between tokens, and parking its sequence off the context.

llama-cpp-python (0.3.36) serves one sequence per ``Llama``: seq 0 of its one
``llama_context``. A streamed generation is the generator ``Llama.create_completion(
stream=True)`` returns; between two of its chunks the inner ``Llama.generate`` is
suspended at ``yield token``: the token it just sampled is not evaluated yet, the KV cells
hold exactly ``Llama.n_tokens`` tokens and the next step evaluates that token first, so
no logits need keeping. What the sequence is, besides the Python frames of the suspended
generators:

* its KV cells: ``llama_state_seq_get_data(ctx, seq 0)`` copies them to host memory
  (from device buffers too), ``llama_state_seq_set_data`` writes them back (clearing
  seq 0 first);
* the fields ``Llama`` keeps per sequence: ``n_tokens``, ``input_ids[:n_tokens]``,
  ``_requires_eval`` and ``_mirostat_mu``;
* its sampler chain ``Llama._sampler`` (llama.cpp's ``llama_sampler``): the ``dist``
  sampler's seeded RNG, the penalties' recent tokens and a grammar's parse state live
  there. Another generation builds its own chain and overwrites the attribute; putting
  the saved chain object back makes a resumed generation draw the very numbers it
  would have drawn unpaused.

A :class:`ContextGate` says who may use the context now: one running stream holds it
(others are refused as busy); a paused stream lets others in, and the first of them
saves ("spills") the paused sequence before it touches the cells. ``park`` saves it at
once. A resumed stream gets its cells back unless nothing else used the context since
(the gate's ``epoch`` did not move); if llama.cpp refuses the saved cells, the stream's
tokens are evaluated again (the prompt is recomputed, the sampler is still its own).

An unload (:meth:`ContextGate.rest`) saves the paused sequence still in the cells and
keeps every paused stream whose sampler chain may outlive the model
(:func:`~accelmux.models.llama_samplers.model_bound`); the others end. The suspended
generators stay bound to their ``Llama`` object, which keeps no model or context while
unloaded; the next load of the same file gives that very object a new model and context
(:meth:`ContextGate.wake`), and a resume restores the saved cells into the new context.
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

from accelmux.errors import BackendError, RequestError
from accelmux.models import llama_adapter
from accelmux.models.llama_samplers import detach_grammar, model_bound

SEQ = 0  # the one sequence llama-cpp-python uses


class Started(NamedTuple):
    """A generation as it starts: its chunks, its prompt's length in tokens, and the
    ``LlamaGrammar`` its output follows (None: free text)."""

    chunks: Iterator[Any]
    n_prompt: int
    grammar: Any = None


@dataclass(frozen=True)
class SavedSequence:
    """One sequence saved off the context (host memory)."""

    kv: Any  # a ctypes uint8 array filled by llama_state_seq_get_data
    kv_bytes: int
    input_ids: Any  # numpy copy of Llama.input_ids[:n_tokens]
    n_tokens: int
    sampler: Any
    requires_eval: bool
    mirostat_mu: Any
    epoch: int  # the gate's epoch when it was saved

    @property
    def nbytes(self) -> int:
        return self.kv_bytes + int(self.input_ids.nbytes)


def save_sequence(llm: Any, epoch: int) -> SavedSequence:
    """Copy seq 0's KV cells and ``llm``'s per-sequence fields (the cells stay too)."""
    llama_cpp = llama_adapter.runtime()
    ctx = llama_adapter.context_pointer(llm)
    size = int(llama_cpp.llama_state_seq_get_size(ctx, SEQ))
    buf = (ctypes.c_uint8 * max(1, size))()
    written = int(llama_cpp.llama_state_seq_get_data(ctx, buf, size, SEQ)) if size else 0
    if written > size:
        raise BackendError(f"llama.cpp wrote {written} bytes of sequence state into {size}")
    n = int(llm.n_tokens)
    return SavedSequence(
        kv=buf,
        kv_bytes=written,
        input_ids=llm.input_ids[:n].copy(),
        n_tokens=n,
        sampler=llama_adapter.sampler(llm),
        requires_eval=llama_adapter.requires_eval(llm),
        mirostat_mu=llama_adapter.mirostat_mu(llm),
        epoch=epoch,
    )


def restore_sequence(llm: Any, saved: SavedSequence) -> bool:
    """Put ``saved`` back into ``llm``'s context. True: its cells were restored; False:
    llama.cpp refused them and its tokens were evaluated again."""
    llama_cpp = llama_adapter.runtime()
    n = saved.n_tokens
    if n >= int(llm.n_ctx()):
        raise BackendError(
            f"a paused sequence of {n} tokens no longer fits the {llm.n_ctx()}-token context"
        )
    restored = False
    if saved.kv_bytes:
        pointer = llama_adapter.context_pointer(llm)
        got = llama_cpp.llama_state_seq_set_data(pointer, saved.kv, saved.kv_bytes, SEQ)
        restored = int(got) == saved.kv_bytes
    if restored:
        llm.input_ids[:n] = saved.input_ids
        llm.n_tokens = n
    else:  # recompute: the same tokens at the same positions
        llama_adapter.clear_kv(llm)
        llm.n_tokens = 0
        if n:
            llm.eval([int(t) for t in saved.input_ids])
    llama_adapter.set_sampler(llm, saved.sampler)
    llama_adapter.set_requires_eval(llm, saved.requires_eval)
    llama_adapter.set_mirostat_mu(llm, saved.mirostat_mu)
    return restored


@dataclass(frozen=True)
class SequenceReport:
    """What a pause or a resume did. ``state``: running, paused or ended."""

    state: str
    parked_bytes: int = 0
    seconds: float = 0.0
    restored: bool = False  # resume: the saved cells were written back
    recomputed: bool = False  # resume: its tokens were evaluated again instead

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "parked_bytes": self.parked_bytes,
            "seconds": round(self.seconds, 6),
            "restored": self.restored,
            "recomputed": self.recomputed,
        }


class ContextGate:
    """Who may use one ``Llama``'s context now, and whose sequence is in its cells.

    ``holder``: a running stream (between its steps too): any other use is refused as
    busy. ``occupant``: the stream whose sequence the cells hold (running, or paused and
    not yet saved). ``epoch`` moves whenever a different user takes the context.
    Not a scheduler: callers take turns; the lock only refuses a second caller at once.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self.holder: TextStream | None = None
        self.occupant: TextStream | None = None
        self.epoch = 0
        #: why the context cannot be used now (its model is unloaded); "" when loaded
        self.resting = ""
        self._last_user: object | None = None
        self._streams: weakref.WeakSet[TextStream] = weakref.WeakSet()

    @contextmanager
    def exclusive(self, what: str = "another request") -> Iterator[None]:
        if not self._lock.acquire(blocking=False):
            raise BackendError(f"{self.name} is busy with {what}")
        try:
            yield
        finally:
            self._lock.release()

    @contextmanager
    def claim(self, llm: Any, user: TextStream | None) -> Iterator[SequenceReport | None]:
        """Use the context as ``user`` (a stream, or None: a one-off call): a paused
        occupant is saved first, ``user``'s own saved sequence is put back. Yields what
        that restore did (None: nothing to restore)."""
        with self.exclusive():
            if self.resting:
                raise BackendError(self.resting)
            if self.holder is not None and self.holder is not user:
                raise BackendError(f"{self.name} is busy with another request")
            occupant = self.occupant
            if occupant is not None and occupant is not user:
                occupant.saved = save_sequence(llm, self.epoch)
                self.occupant = None
            report = None
            if user is not None and user.saved is not None:
                saved = user.saved
                started = time.perf_counter()
                if saved.epoch == self.epoch:  # nobody used the cells since: still there
                    report = SequenceReport("running", saved.nbytes)
                else:  # a failure keeps the saved state (the stream stays paused)
                    restored = restore_sequence(llm, saved)
                    report = SequenceReport(
                        "running",
                        saved.nbytes,
                        time.perf_counter() - started,
                        restored=restored,
                        recomputed=not restored,
                    )
                user.saved = None
            if self._last_user is not user or user is None:
                self.epoch += 1
                self._last_user = user
            if user is not None:
                self.occupant = user
            yield report

    def park(self, llm: Any, stream: TextStream) -> None:
        """Save ``stream``'s sequence now (it is paused and holds the cells)."""
        with self.exclusive():
            if self.occupant is stream and stream.saved is None:
                stream.saved = save_sequence(llm, self.epoch)
                self.occupant = None

    def track(self, stream: TextStream) -> None:
        self._streams.add(stream)

    def rest(self, llm: Any, why: str) -> int:
        """The model unloads (the caller holds :meth:`exclusive` and frees ``llm``'s
        model and context next): the paused sequence still in the cells is saved, every
        paused stream whose sampler may outlive the model is kept (its saved state stays
        in host memory), the others end. Until :meth:`wake` every use is refused with
        ``why``. Returns how many paused streams are kept."""
        if self.holder is not None:
            raise BackendError(f"{self.name} is busy with a stream")
        occupant = self.occupant
        if occupant is not None and occupant.state == "paused" and occupant.saved is None:
            occupant.saved = save_sequence(llm, self.epoch)
        kept = 0
        for stream in list(self._streams):
            if stream.state != "paused":
                continue
            saved = stream.saved
            bound = model_bound(saved.sampler) if saved is not None else []
            if saved is not None and bound == ["grammar"]:
                regrown = detach_grammar(saved.sampler, stream.grammar, stream.n_prompt, llm)
                if regrown is not None:
                    stream.saved = dataclasses.replace(saved, sampler=regrown)
                    bound = []
            if bound:
                stream.end(
                    f"{self.name} was unloaded while this stream was paused, and its "
                    f"sampler ({', '.join(bound)}) refers to the unloaded model's "
                    "vocabulary: it cannot continue on another copy of the model"
                )
            else:
                kept += 1
        self.holder = self.occupant = None
        self._last_user = None
        self.epoch += 1
        self.resting = why
        return kept

    def wake(self) -> None:
        """The model is loaded again (a new context): saved sequences are restored on
        resume."""
        self.resting = ""
        self._last_user = None
        self.epoch += 1

    def paused(self) -> list[TextStream]:
        """The paused streams of this context (or of its unloaded model)."""
        return [s for s in list(self._streams) if s.state == "paused"]

    def end_all(self, why: str) -> None:
        """End every open stream (the model goes away under them)."""
        for stream in list(self._streams):
            stream.end(why)
        self.holder = self.occupant = None
        self._last_user = None


class TextStream(Iterator[str]):
    """One streamed generation: an iterator of text deltas that can pause between them.

    Iterating runs one step at a time on the model (a running stream holds it: any other
    request is refused as busy, as before). :meth:`pause` lets others use the model;
    ``park=True`` also saves the sequence off the context now (otherwise the first other
    user saves it). :meth:`resume` takes the model back (restoring the saved sequence),
    then iteration continues with nothing lost or repeated.
    """

    def __init__(
        self, gate: ContextGate, llm: Any, start: Callable[[], Started], field: str
    ) -> None:
        self._gate = gate
        self._llm = llm
        self._start = start
        self._field = field
        self._chunks: Iterator[Any] | None = None
        self.state = "running"  # running, paused, ended
        self.saved: SavedSequence | None = None
        self.n_prompt = 0
        self.grammar: Any = None
        self._why = ""
        gate.track(self)

    @property
    def parked_bytes(self) -> int:
        saved = self.saved
        return saved.nbytes if saved is not None else 0

    @property
    def why(self) -> str:
        """Why it ended, when it ended on an error ("" otherwise)."""
        return self._why

    def __iter__(self) -> TextStream:
        return self

    def __next__(self) -> str:
        if self.state == "ended":
            if self._why:
                raise BackendError(self._why)
            raise StopIteration
        if self.state == "paused":
            raise BackendError(f"{self._gate.name}: this stream is paused; resume it first")
        with self._gate.claim(self._llm, self):
            self._gate.holder = self
            try:
                if self._chunks is None:
                    self._chunks, self.n_prompt, self.grammar = self._start()
                for chunk in self._chunks:
                    text = str(chunk["choices"][0].get("text") or "")
                    if text:
                        return text
            except ValueError as exc:
                self._finish()
                raise RequestError(f"{self._gate.name}: {exc}", field=self._field) from exc
            except BaseException:
                self._finish()
                raise
            self._finish()
        raise StopIteration

    def pause(self, *, park: bool = False) -> SequenceReport:
        """Stop between two deltas; with ``park``, save the sequence off the context."""
        if self.state == "ended":
            return SequenceReport("ended")
        started = time.perf_counter()
        self.state = "paused"
        if self._gate.holder is self:
            self._gate.holder = None
        if park:
            self._gate.park(self._llm, self)
        return SequenceReport("paused", self.parked_bytes, time.perf_counter() - started)

    def resume(self) -> SequenceReport:
        """Take the model back; the next delta continues where the stream stopped.

        Raises BackendError while the model is unloaded or busy, or when its saved
        sequence cannot be restored (it does not fit the context): the stream stays
        paused, its saved state kept."""
        if self.state != "paused":
            return SequenceReport(self.state)
        started = time.perf_counter()
        with self._gate.claim(self._llm, self) as restore:
            self._gate.holder = self
            self.state = "running"
        seconds = time.perf_counter() - started
        if restore is None:
            return SequenceReport("running", seconds=seconds)
        return SequenceReport(
            "running",
            restore.parked_bytes,
            seconds,
            restored=restore.restored,
            recomputed=restore.recomputed,
        )

    def end(self, why: str = "") -> None:
        """End the stream; a later step raises BackendError(``why``) when one is given."""
        if self.state != "ended":
            self._why = why
            self._finish()

    def close(self) -> None:
        self.end()

    def _finish(self) -> None:
        self.state = "ended"
        self.saved = None
        if self._gate.holder is self:
            self._gate.holder = None
        if self._gate.occupant is self:
            self._gate.occupant = None
        chunks, self._chunks = self._chunks, None
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
