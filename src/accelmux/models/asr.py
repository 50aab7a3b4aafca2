"""Speech to text with PocketSphinx and its bundled US English model.

Input is a WAV file of any sample rate and channel count; it is mixed to mono
and resampled to 16 kHz with numpy (:mod:`accelmux.models.audio`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelmux.errors import BackendError, RequestError
from accelmux.models._deps import require
from accelmux.models.assets import dir_size, pocketsphinx_en_us
from accelmux.models.audio import decode_wav, resample, to_pcm16

SAMPLE_RATE = 16_000
#: Resident bytes per byte of model files (acoustic model, language model, dictionary):
#: the decoder expands them into its own tables (measured: 91 MiB loaded, 103 MiB after a
#: request, for 37 MB of files).
SPHINX_MODEL_FACTOR = 3
#: Decoder state beyond the model, and per second of audio in one request (features, lattice).
SPHINX_RUNTIME_BYTES = 8 * 2**20
SPHINX_BYTES_PER_AUDIO_SECOND = 256 * 1024


@dataclass(frozen=True)
class Transcript:
    text: str
    duration_s: float


class PocketsphinxRecognizer:
    """WAV bytes -> text. One request at a time."""

    def __init__(
        self,
        *,
        hmm: str | Path | None = None,
        lm: str | Path | None = None,
        dict_path: str | Path | None = None,
        max_seconds: float = 600.0,
    ) -> None:
        self._paths = (Path(hmm), Path(lm), Path(dict_path)) if hmm and lm and dict_path else None
        self.max_seconds = max_seconds
        self._decoder: Any = None

    @property
    def model_paths(self) -> tuple[Path, Path, Path]:
        """(acoustic model dir, language model, pronunciation dictionary)."""
        return self._paths or pocketsphinx_en_us()

    @property
    def loaded(self) -> bool:
        return self._decoder is not None

    def memory_estimate(self, audio_seconds: float = 60.0) -> int:
        """``3 x model files`` + 8 MiB + 256 KiB per second of audio in one request."""
        files = sum(dir_size(p) for p in self.model_paths)
        audio = int(min(audio_seconds, self.max_seconds) * SPHINX_BYTES_PER_AUDIO_SECOND)
        return files * SPHINX_MODEL_FACTOR + SPHINX_RUNTIME_BYTES + audio

    def load(self) -> None:
        if self._decoder is not None:
            return
        ps = require("pocketsphinx", "pocketsphinx")
        hmm, lm, dic = self.model_paths
        try:
            self._decoder = ps.Decoder(
                hmm=str(hmm), lm=str(lm), dict=str(dic), samprate=SAMPLE_RATE, loglevel="FATAL"
            )
        except Exception as exc:
            raise BackendError(f"pocketsphinx cannot load its model from {hmm}: {exc}") from exc

    def unload(self) -> None:
        self._decoder = None

    def transcribe(self, wav: bytes) -> Transcript:
        """Recognise the speech in a WAV file (any rate, any channels)."""
        decoder = self._decoder
        if decoder is None:
            raise BackendError("the speech recogniser is not loaded")
        audio = decode_wav(wav)
        if audio.duration_s > self.max_seconds:
            raise RequestError(
                f"audio lasts {audio.duration_s:.0f} s; the limit is {self.max_seconds:.0f} s",
                field="audio",
                status=413,
            )
        pcm = to_pcm16(resample(audio.samples, audio.sample_rate, SAMPLE_RATE))
        try:
            # The feature front end keeps a running cepstral mean across utterances;
            # reset it so that one request's text never depends on the audio before it.
            decoder.reinit_feat()
            decoder.start_utt()
            decoder.process_raw(pcm, full_utt=True)
            decoder.end_utt()
        except Exception as exc:
            raise BackendError(f"pocketsphinx failed: {exc}") from exc
        hyp = decoder.hyp()
        text = str(hyp.hypstr) if hyp is not None else ""
        return Transcript(text=text.strip(), duration_s=audio.duration_s)
