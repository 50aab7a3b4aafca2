"""WAV encoding/decoding and resampling with the standard library and numpy.

:func:`decode_wav` reads RIFF/WAVE files with integer PCM (8, 16, 24 or 32 bit)
or IEEE float (32 or 64 bit) samples, plain or ``WAVE_FORMAT_EXTENSIBLE``, any
channel count; malformed input raises :class:`~accelmux.errors.RequestError`.
numpy is imported inside the functions (it comes with the model runtimes).
"""

from __future__ import annotations

import io
import struct
import wave
from dataclasses import dataclass
from typing import Any

from accelmux.errors import RequestError
from accelmux.models._deps import require

_PCM = 1
_FLOAT = 3
_EXTENSIBLE = 0xFFFE
#: Longest audio accepted by :func:`decode_wav` (one hour of 48 kHz stereo float64 is 1.4 GB).
MAX_SAMPLES = 48_000 * 60 * 60


@dataclass(frozen=True)
class Audio:
    """Mono float32 samples in [-1, 1] and their sample rate."""

    samples: Any  # numpy.ndarray, shape (n,), float32
    sample_rate: int

    @property
    def duration_s(self) -> float:
        return len(self.samples) / self.sample_rate if self.sample_rate else 0.0


def _bad(message: str) -> RequestError:
    return RequestError(f"malformed audio: {message}", field="audio")


def decode_wav(data: bytes, *, field: str = "audio") -> Audio:
    """Decode a WAV file to mono float32 (channels averaged)."""
    np = require("numpy", "numpy")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise RequestError("audio must be bytes", field=field)
    buf = bytes(data)
    if len(buf) < 12 or buf[:4] != b"RIFF" or buf[8:12] != b"WAVE":
        raise _bad("not a RIFF/WAVE file")
    pos = 12
    fmt: tuple[int, int, int, int] | None = None  # (format, channels, rate, bits)
    payload: bytes | None = None
    while pos + 8 <= len(buf):
        chunk_id = buf[pos : pos + 4]
        (size,) = struct.unpack_from("<I", buf, pos + 4)
        body = buf[pos + 8 : pos + 8 + size]
        if chunk_id == b"fmt ":
            if len(body) < 16:
                raise _bad("fmt chunk too short")
            tag, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", body)
            if tag == _EXTENSIBLE:
                if len(body) < 40:
                    raise _bad("extensible fmt chunk too short")
                (tag,) = struct.unpack_from("<H", body, 24)  # first two bytes of the GUID
            fmt = (tag, channels, rate, bits)
        elif chunk_id == b"data":
            payload = body  # a truncated final chunk is read as far as it goes
            break
        pos += 8 + size + (size & 1)
    if fmt is None:
        raise _bad("no fmt chunk")
    if payload is None:
        raise _bad("no data chunk")
    tag, channels, rate, bits = fmt
    if channels < 1 or channels > 32:
        raise _bad(f"{channels} channels")
    if rate < 1000 or rate > 384_000:
        raise _bad(f"sample rate {rate} Hz")
    width = bits // 8
    if bits % 8 or width not in (1, 2, 3, 4, 8):
        raise _bad(f"{bits}-bit samples")
    frame = width * channels
    n_frames = len(payload) // frame
    if n_frames == 0:
        raise _bad("no samples")
    if n_frames > MAX_SAMPLES:
        raise RequestError(f"audio longer than {MAX_SAMPLES} samples", field=field, status=413)
    raw = payload[: n_frames * frame]
    if tag == _PCM and width == 1:
        x = (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif tag == _PCM and width == 2:
        x = np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
    elif tag == _PCM and width == 3:
        b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        v = np.where(v >= 1 << 23, v - (1 << 24), v)
        x = v.astype(np.float32) / float(1 << 23)
    elif tag == _PCM and width == 4:
        x = (np.frombuffer(raw, dtype="<i4").astype(np.float64) / 2147483648.0).astype(np.float32)
    elif tag == _FLOAT and width in (4, 8):
        x = np.frombuffer(raw, dtype="<f4" if width == 4 else "<f8").astype(np.float32)
        if not np.all(np.isfinite(x)):
            raise _bad("non-finite float samples")
        x = np.clip(x, -1.0, 1.0)
    else:
        raise _bad(f"unsupported sample format (tag {tag}, {bits} bit)")
    if channels > 1:
        x = x.reshape(-1, channels).mean(axis=1)
    return Audio(samples=np.ascontiguousarray(x, dtype=np.float32), sample_rate=rate)


def resample(samples: Any, rate: int, target: int) -> Any:
    """Resample mono float samples from ``rate`` to ``target`` Hz.

    Downsampling first low-passes with a Hann-windowed sinc filter (cut-off at
    0.45 x the target rate) to avoid aliasing, then interpolates linearly.
    """
    np = require("numpy", "numpy")
    x = np.asarray(samples, dtype=np.float32)
    if rate == target or len(x) == 0:
        return x
    if target < rate:
        cutoff = 0.45 * target / rate  # cycles per input sample
        half = 32
        n = np.arange(-half, half + 1)
        taps = 2 * cutoff * np.sinc(2 * cutoff * n) * np.hanning(2 * half + 1)
        taps /= taps.sum()
        x = np.convolve(x, taps.astype(np.float32), mode="same")
    n_out = max(1, round(len(x) * target / rate))
    positions = np.arange(n_out, dtype=np.float64) * (rate / target)
    return np.interp(positions, np.arange(len(x)), x).astype(np.float32)


def to_pcm16(samples: Any) -> bytes:
    """Float samples in [-1, 1] -> little-endian 16-bit PCM bytes."""
    np = require("numpy", "numpy")
    x = np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0)
    return bytes((x * 32767.0).round().astype("<i2").tobytes())


def encode_wav(pcm16: bytes, sample_rate: int, channels: int = 1) -> bytes:
    """Wrap 16-bit PCM bytes in a WAV container."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(pcm16)
    return out.getvalue()
