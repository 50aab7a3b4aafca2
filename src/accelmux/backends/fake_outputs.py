"""Deterministic outputs of the fake backend (a test double): text, vectors, WAV, PNG, boxes.

Everything is derived from a SHA-256 of the input, so the same request always gets the
same answer, on any machine. The OpenAI shapes they are answered in are
:mod:`accelmux.openai_shapes`, shared with the real backends.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import math
import struct
import wave
import zlib
from typing import Any

_PHRASE = (
    "fake reply from accelmux test double: the quick brown fox jumps over the lazy dog "
    "while memory stays within budget and every decision has a reason"
)
WORDS = tuple(_PHRASE.split(" "))


def digest(*parts: object) -> bytes:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else json.dumps(p, sort_keys=True).encode())
        h.update(b"\x00")
    return h.digest()


def reply_words(seed: bytes, max_tokens: int) -> list[str]:
    """Between 4 and 24 words (never more than ``max_tokens``), chosen by ``seed``."""
    n = max(1, min(max_tokens, 4 + seed[0] % 21))
    return [WORDS[(seed[i % len(seed)] + i) % len(WORDS)] for i in range(n)]


def embedding(text: str, dim: int) -> list[float]:
    """A unit vector from the text's hash (stable across runs and machines)."""
    raw = b""
    counter = 0
    while len(raw) < dim * 4:
        raw += hashlib.sha256(text.encode() + counter.to_bytes(4, "big")).digest()
        counter += 1
    ints = struct.unpack(f">{dim}I", raw[: dim * 4])
    vec = [(i / 0xFFFFFFFF) * 2.0 - 1.0 for i in ints]
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return [round(v / norm, 6) for v in vec]


def wav(seed: bytes, seconds: float, rate: int = 16000) -> bytes:
    """A mono 16-bit WAV tone whose pitch comes from ``seed``."""
    freq = 220.0 + seed[0] * 2
    n = max(1, int(seconds * rate))
    frames = bytearray()
    for i in range(n):
        frames += struct.pack("<h", int(8000 * math.sin(2 * math.pi * freq * i / rate)))
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(bytes(frames))
    return buf.getvalue()


def png(seed: bytes, width: int, height: int) -> bytes:
    """A solid-colour RGB PNG (colour from ``seed``); sizes are capped to keep it small."""
    width, height = max(1, min(width, 256)), max(1, min(height, 256))
    row = b"\x00" + bytes(seed[:3]) * width
    raw = row * height

    def chunk(tag: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + tag
            + data
            + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def png_b64(seed: bytes, width: int, height: int) -> str:
    return base64.b64encode(png(seed, width, height)).decode()


LABELS = ("person", "car", "cat", "dog", "bicycle", "package")


def boxes(seed: bytes, width: int, height: int) -> list[dict[str, Any]]:
    """One to three boxes, inside the image, with labels and scores from ``seed``."""
    out = []
    for i in range(1 + seed[0] % 3):
        s = seed[4 * i + 1 : 4 * i + 5]
        x = s[0] / 255 * width * 0.6
        y = s[1] / 255 * height * 0.6
        w = max(1.0, s[2] / 255 * (width - x) * 0.9)
        h = max(1.0, s[3] / 255 * (height - y) * 0.9)
        out.append(
            {
                "label": LABELS[(s[0] + s[3]) % len(LABELS)],
                "score": round(0.5 + (s[2] % 50) / 100, 3),
                "box": [round(x, 1), round(y, 1), round(x + w, 1), round(y + h, 1)],
            }
        )
    return out
