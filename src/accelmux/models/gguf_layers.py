"""A GGUF model's weights per layer, read with the ``gguf`` package, and how many layers
fit in a given amount of GPU memory.

llama.cpp counts the output layer as one more layer after the repeating blocks
(``blk.N.*``) and offloads from that end: ``n_gpu_layers: k`` puts the output layer and
the last ``k - 1`` blocks on the GPU (``n_layers + 1``: everything); the token
embeddings stay on the CPU. :func:`layers_that_fit` answers
"how many layers can this model put on a GPU with this much free memory and this
context": the sizes of the blocks and of the output layer from the file, the KV cache of
each offloaded block, and a fixed part (compute buffers) the caller gives. It is the
measure a partial offload is chosen by; choosing when to offload partially is the
policy's, not this module's.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path

from accelmux.errors import BackendError

BLOCK = re.compile(r"^blk\.(\d+)\.")
#: Tensors llama.cpp keeps with the output layer (offloaded with the last block).
OUTPUT_TENSORS = frozenset({"output.weight", "output_norm.weight", "output_norm.bias"})


@dataclass(frozen=True, slots=True)
class GgufLayers:
    """Bytes per repeating block (index order), of the output layer, and of the rest
    (token embeddings: they stay on the CPU)."""

    blocks: tuple[int, ...]
    output_bytes: int
    other_bytes: int

    @property
    def total_bytes(self) -> int:
        return sum(self.blocks) + self.output_bytes + self.other_bytes


def gguf_layers(path: str | Path) -> GgufLayers:
    """Read the tensor sizes of ``path`` (a BackendError when it cannot be read)."""
    try:
        gguf = importlib.import_module("gguf")
        reader = gguf.GGUFReader(str(path))
    except ImportError:
        raise BackendError("the gguf package is not installed (pip install gguf)") from None
    except (OSError, ValueError) as exc:
        raise BackendError(f"{path}: cannot read GGUF tensors: {exc}") from None
    blocks: dict[int, int] = {}
    output = other = 0
    for tensor in reader.tensors:
        name, size = str(tensor.name), int(tensor.n_bytes)
        match = BLOCK.match(name)
        if match:
            blocks[int(match.group(1))] = blocks.get(int(match.group(1)), 0) + size
        elif name in OUTPUT_TENSORS:
            output += size
        else:
            other += size
    ordered = tuple(blocks.get(i, 0) for i in range(max(blocks, default=-1) + 1))
    return GgufLayers(blocks=ordered, output_bytes=output, other_bytes=other)


def layers_that_fit(
    layers: GgufLayers, free_bytes: int, *, kv_bytes_per_layer: int, fixed_bytes: int = 0
) -> int:
    """The ``n_gpu_layers`` to give llama.cpp so that what it offloads (the output layer,
    then blocks from the last one down, each with its KV cache) fits in ``free_bytes``
    besides ``fixed_bytes``; 0 when not even the output layer does."""
    room = free_bytes - fixed_bytes - layers.output_bytes
    if room < 0:
        return 0
    count = 1  # the output layer
    for size in reversed(layers.blocks):
        need = size + kv_bytes_per_layer
        if need > room:
            break
        room -= need
        count += 1
    return count
