"""Memory profile of a GGUF model, read from the file's header.

:func:`gguf_profile` parses only the GGUF header (metadata key/values and tensor
infos) with the standard library: weights are the bytes of the tensor data,
and the KV cache costs, per token of context,
``sum over layers of n_kv_heads x (key_length + value_length) x 2 bytes`` (f16),
which is ``2 x n_layers x n_kv_heads x head_dim x 2`` when every layer is alike.

Why not ``gguf.GGUFReader``: it decodes every metadata array eagerly, and the
262,144-entry vocabulary of Gemma 3 takes it about 16 s; this parser skips
arrays and reads the same header in well under a second. The ``gguf`` package
is used in the tests to cross-check the numbers.

:func:`llama_memory_estimate` turns a profile into the bytes llama.cpp
allocates for a context of ``n_ctx`` tokens (see docs/models.md).
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accelmux.errors import BackendError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
#: llama.cpp rounds a context's size up to a multiple of this many cells.
KV_CELL_PADDING = 256
#: llama.cpp's host memory beyond its buffers: fixed part and per vocabulary entry (measured
#: after a first request: 26 MiB for SmolLM2's 49,152 entries, 69 MiB for Gemma 3's 262,144,
#: which includes 12.7 MiB of weights repacked for the CPU).
LLAMA_RUNTIME_BYTES = 16 * 2**20
LLAMA_BYTES_PER_VOCAB_ENTRY = 224
#: Keep numeric arrays up to this length (per-layer values); longer ones keep only a count.
_SMALL_ARRAY = 4096

# GGUF value types -> struct format (scalars only)
_SCALARS: dict[int, str] = {
    0: "<B",  # uint8
    1: "<b",  # int8
    2: "<H",  # uint16
    3: "<h",  # int16
    4: "<I",  # uint32
    5: "<i",  # int32
    6: "<f",  # float32
    7: "<?",  # bool
    10: "<Q",  # uint64
    11: "<q",  # int64
    12: "<d",  # float64
}
_STRING = 8
_ARRAY = 9


@dataclass(frozen=True)
class ArrayInfo:
    """A metadata array: its element type and length (values kept only when short and numeric)."""

    element_type: int
    length: int
    values: tuple[Any, ...] | None = None


@dataclass(frozen=True)
class GgufProfile:
    """What a GGUF file costs in memory, and the hyper-parameters that decide it."""

    path: Path
    architecture: str
    name: str
    file_bytes: int
    weights_bytes: int
    n_tensors: int
    n_layers: int
    n_embd: int
    n_ff: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    head_dim_v: int
    kv_bytes_per_token: int
    context_length: int
    n_vocab: int
    sliding_window: int | None
    has_chat_template: bool
    license: str | None
    metadata: Mapping[str, Any] = field(repr=False, default_factory=dict)

    def kv_bytes(self, n_ctx: int, *, bytes_per_element: int = 2) -> int:
        """KV cache bytes for ``n_ctx`` tokens (padded as llama.cpp pads), f16 by default."""
        per_token = self.kv_bytes_per_token * bytes_per_element // 2
        return per_token * pad_context(n_ctx)


@dataclass(frozen=True)
class LlamaMemoryEstimate:
    """Bytes llama.cpp needs for one model with one context (see docs/models.md)."""

    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    output_bytes: int
    runtime_bytes: int

    @property
    def resident_bytes(self) -> int:
        """What a CPU process shows as RSS: the compute buffer is reserved but barely touched."""
        return self.weights_bytes + self.kv_bytes + self.output_bytes + self.runtime_bytes

    @property
    def total_bytes(self) -> int:
        """Everything allocated (on an accelerator all of it is committed)."""
        return self.resident_bytes + self.compute_bytes


def pad_context(n_ctx: int) -> int:
    """``n_ctx`` rounded up to llama.cpp's KV cell padding."""
    if n_ctx <= 0:
        raise ValueError(f"n_ctx must be positive, got {n_ctx}")
    return -(-n_ctx // KV_CELL_PADDING) * KV_CELL_PADDING


def llama_memory_estimate(
    profile: GgufProfile,
    n_ctx: int,
    *,
    n_ubatch: int = 512,
    n_seq: int = 1,
    kv_bytes_per_element: int = 2,
) -> LlamaMemoryEstimate:
    """Estimate llama.cpp's allocations for ``profile`` with a context of ``n_ctx`` tokens.

    - weights: the tensor bytes of the file;
    - KV cache: :meth:`GgufProfile.kv_bytes` (full-size cache on every layer, as
      llama.cpp's default ``swa_full`` allocates it);
    - compute buffer (without flash attention): the larger of the logits of one
      micro-batch (``n_ubatch x n_vocab x 4``) and the attention scores plus mask
      (``n_ubatch x n_ctx x (n_heads + 1) x 4``), plus the micro-batch's
      activations (``n_ubatch x (n_embd + n_ff) x 8``);
    - output buffer: one row of f32 logits per sequence;
    - runtime (host memory): vocabulary tables and the library's own state,
      ``16 MiB + 224 bytes per vocabulary entry``.
    """
    ctx = pad_context(n_ctx)
    ubatch = max(1, min(n_ubatch, ctx))
    logits = ubatch * profile.n_vocab * 4
    attention = ubatch * ctx * (profile.n_heads + 1) * 4
    activations = ubatch * (profile.n_embd + profile.n_ff) * 8
    return LlamaMemoryEstimate(
        weights_bytes=profile.weights_bytes,
        kv_bytes=profile.kv_bytes(ctx, bytes_per_element=kv_bytes_per_element),
        compute_bytes=max(logits, attention) + activations,
        output_bytes=profile.n_vocab * 4 * max(1, n_seq),
        runtime_bytes=LLAMA_RUNTIME_BYTES + profile.n_vocab * LLAMA_BYTES_PER_VOCAB_ENTRY,
    )


class _Cursor:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: mmap.mmap) -> None:
        self.buf = buf
        self.pos = 0

    def unpack(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.unpack("<Q")
        raw = self.buf[self.pos : self.pos + length]
        if len(raw) != length:
            raise ValueError("string runs past the end of the file")
        self.pos += length
        return raw.decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        length = self.unpack("<Q")
        self.pos += length

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype = self.unpack("<I")
            count = self.unpack("<Q")
            if etype in _SCALARS:
                fmt = _SCALARS[etype]
                size = struct.calcsize(fmt)
                values: tuple[Any, ...] | None = None
                if count <= _SMALL_ARRAY:
                    values = struct.unpack_from(f"<{count}{fmt[1]}", self.buf, self.pos)
                self.pos += size * count
                return ArrayInfo(etype, count, values)
            if etype == _STRING:
                for _ in range(count):
                    self.skip_string()
                return ArrayInfo(etype, count)
            if etype == _ARRAY:
                for _ in range(count):
                    self.value(_ARRAY)
                return ArrayInfo(etype, count)
            raise ValueError(f"unknown GGUF array element type {etype}")
        raise ValueError(f"unknown GGUF value type {vtype}")


def read_gguf_header(path: Path) -> tuple[dict[str, Any], list[tuple[str, int]], int, int]:
    """Parse a GGUF header: (metadata, [(tensor name, data offset)], data start, file size)."""
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != GGUF_MAGIC:
            raise ValueError("not a GGUF file (bad magic)")
        cur = _Cursor(buf)
        cur.pos = 4
        version = cur.unpack("<I")
        if version < 2 or version > 0xFFFF:
            raise ValueError(f"unsupported GGUF version {version} (or a big-endian file)")
        n_tensors = cur.unpack("<Q")
        n_kv = cur.unpack("<Q")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            vtype = cur.unpack("<I")
            metadata[key] = cur.value(vtype)
        tensors: list[tuple[str, int]] = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.unpack("<I")
            cur.pos += 8 * n_dims  # dimensions
            cur.unpack("<I")  # ggml type
            offset = cur.unpack("<Q")
            tensors.append((name, offset))
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0:
            alignment = DEFAULT_ALIGNMENT
        data_start = -(-cur.pos // alignment) * alignment
        return metadata, tensors, data_start, len(buf)


def _int(meta: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = meta.get(key)
    if isinstance(value, ArrayInfo) and value.values:
        return int(max(value.values))
    if isinstance(value, bool) or value is None:
        if default is None:
            raise ValueError(f"GGUF metadata lacks {key!r}")
        return default
    return int(value)


def _per_layer(meta: Mapping[str, Any], key: str, n_layers: int, default: int) -> list[int]:
    value = meta.get(key)
    if isinstance(value, ArrayInfo) and value.values is not None:
        return [int(v) for v in value.values][:n_layers]
    if value is None or isinstance(value, ArrayInfo):
        return [default] * n_layers
    return [int(value)] * n_layers


def gguf_profile(path: str | Path) -> GgufProfile:
    """Read ``path``'s GGUF header and return its :class:`GgufProfile`.

    Raises :class:`~accelmux.errors.BackendError` if the file is missing or not a
    GGUF file this parser understands.
    """
    p = Path(path)
    try:
        meta, tensors, data_start, file_size = read_gguf_header(p)
        arch = str(meta["general.architecture"])
        n_layers = _int(meta, f"{arch}.block_count")
        n_embd = _int(meta, f"{arch}.embedding_length")
        n_heads = _int(meta, f"{arch}.attention.head_count")
        n_ff = _int(meta, f"{arch}.feed_forward_length", 0)
        head_dim = _int(meta, f"{arch}.attention.key_length", n_embd // max(1, n_heads))
        head_dim_v = _int(meta, f"{arch}.attention.value_length", head_dim)
        kv_heads = _per_layer(meta, f"{arch}.attention.head_count_kv", n_layers, n_heads)
        tokens = meta.get("tokenizer.ggml.tokens")
        n_vocab = _int(
            meta,
            f"{arch}.vocab_size",
            tokens.length if isinstance(tokens, ArrayInfo) else 0,
        )
        window = meta.get(f"{arch}.attention.sliding_window")
        license_ = meta.get("general.license")
    except KeyError as exc:
        raise BackendError(f"{p}: GGUF metadata lacks {exc}") from exc
    except (OSError, ValueError, struct.error) as exc:
        raise BackendError(f"{p}: cannot read GGUF header: {exc}") from exc

    offsets = sorted(off for _, off in tensors)
    data_bytes = file_size - data_start
    weights = data_bytes - offsets[0] if offsets else 0
    return GgufProfile(
        path=p,
        architecture=arch,
        name=str(meta.get("general.name", p.stem)),
        file_bytes=file_size,
        weights_bytes=weights,
        n_tensors=len(tensors),
        n_layers=n_layers,
        n_embd=n_embd,
        n_ff=n_ff,
        n_heads=n_heads,
        n_kv_heads=max(kv_heads) if kv_heads else 0,
        head_dim=head_dim,
        head_dim_v=head_dim_v,
        kv_bytes_per_token=sum(h * (head_dim + head_dim_v) * 2 for h in kv_heads),
        context_length=_int(meta, f"{arch}.context_length", 0),
        n_vocab=n_vocab,
        sliding_window=int(window) if isinstance(window, int) else None,
        has_chat_template="tokenizer.chat_template" in meta,
        license=str(license_) if isinstance(license_, str) else None,
        metadata={k: v for k, v in meta.items() if not isinstance(v, ArrayInfo)},
    )
