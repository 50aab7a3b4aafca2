"""Cheap size probes of uploaded media, for request demand (no decoding libraries)."""

from __future__ import annotations

import io
import struct
import wave

#: Bytes per second assumed for audio that is not a readable WAV (16 kHz, 16-bit mono).
FALLBACK_AUDIO_BPS = 32_000
#: Megapixels assumed for an image whose header cannot be read.
FALLBACK_MEGAPIXELS = 1.0


def audio_seconds(data: bytes) -> float:
    """Duration of a WAV file, else an estimate from the byte count."""
    try:
        with wave.open(io.BytesIO(data), "rb") as w:
            rate = w.getframerate()
            if rate > 0:
                return w.getnframes() / rate
    except (wave.Error, EOFError, struct.error):
        pass
    return len(data) / FALLBACK_AUDIO_BPS


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) of a PNG, JPEG or GIF from its header, or None."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        w, h = struct.unpack(">II", data[16:24])
        return int(w), int(h)
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        w, h = struct.unpack("<HH", data[6:10])
        return int(w), int(h)
    if data[:2] == b"\xff\xd8":
        i = 2
        while i + 9 < len(data):
            if data[i] != 0xFF:
                i += 1
                continue
            marker = data[i + 1]
            if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
                i += 2
                continue
            (length,) = struct.unpack(">H", data[i + 2 : i + 4])
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                h, w = struct.unpack(">HH", data[i + 5 : i + 9])
                return int(w), int(h)
            i += 2 + length
    return None


def megapixels(data: bytes) -> tuple[float, int, int]:
    size = image_size(data)
    if size is None or size[0] <= 0 or size[1] <= 0:
        return FALLBACK_MEGAPIXELS, 0, 0
    return size[0] * size[1] / 1e6, size[0], size[1]


#: Leading bytes of the audio containers accepted for transcription.
_AUDIO_MAGIC = (b"ID3", b"fLaC", b"OggS", b"\x1a\x45\xdf\xa3", b"#!AMR", b"FORM")


def looks_like_audio(data: bytes) -> bool:
    """True for WAV, MP3, FLAC, Ogg, WebM/Matroska, MP4/M4A, AMR or AIFF data."""
    if data[:4] == b"RIFF":
        return data[8:12] == b"WAVE"
    if data.startswith(_AUDIO_MAGIC) or data[4:8] == b"ftyp":
        return True
    return len(data) >= 2 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0  # MPEG frame


def looks_like_image(data: bytes) -> bool:
    """True for data whose header reads as PNG, JPEG or GIF, or that is WebP or BMP."""
    if (data[:4] == b"RIFF" and data[8:12] == b"WEBP") or (data[:2] == b"BM" and len(data) > 26):
        return True
    size = image_size(data)
    return size is not None and size[0] > 0 and size[1] > 0
