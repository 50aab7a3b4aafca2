"""Piper TTS and PocketSphinx ASR: a round trip, and audio handling."""

from __future__ import annotations

import io
import struct
import wave

import pytest

from accelmux.errors import RequestError
from accelmux.models import PiperSpeaker, PocketsphinxRecognizer, Speech
from accelmux.models.audio import decode_wav, resample

from .support import NUMPY, need, wer

pytestmark = pytest.mark.real

SENTENCE = "Please turn on the kitchen lights and set the temperature to twenty degrees."
#: PocketSphinx's small US English model on Piper's voice; it gets 0-2 words of 13 wrong.
MAX_WER = 0.25


@pytest.fixture(scope="module")
def speech() -> Speech:
    """The sentence voiced without Piper's sampling noise: the same audio on every run,
    so a threshold on its transcript cannot pass or fail by chance."""
    speaker = PiperSpeaker(noise_scale=0.0, noise_w_scale=0.0)
    speaker.load()
    try:
        return speaker.synthesize(SENTENCE)
    finally:
        speaker.unload()


def test_without_noise_a_text_is_spoken_the_same_way_every_time(speech: Speech) -> None:
    speaker = PiperSpeaker(noise_scale=0.0, noise_w_scale=0.0)
    speaker.load()
    try:
        assert speaker.synthesize(SENTENCE).wav == speech.wav
    finally:
        speaker.unload()


def test_tts_makes_a_16_bit_mono_wav(speaker: PiperSpeaker, speech: Speech) -> None:
    assert speech.sample_rate == speaker.sample_rate == 22050
    with wave.open(io.BytesIO(speech.wav)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 22050)
        assert w.getnframes() == speech.n_samples
    assert 2.0 < speech.duration_s < 8.0


def test_tts_asr_round_trip(recognizer: PocketsphinxRecognizer, speech: Speech) -> None:
    text = recognizer.transcribe(speech.wav).text
    assert wer(SENTENCE, text) <= MAX_WER, text


def _as_wav(samples: object, rate: int, channels: int, sampwidth: int = 2) -> bytes:
    import numpy as np

    x = np.asarray(samples, dtype=np.float32)
    frames = np.repeat(x[:, None], channels, axis=1)
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(sampwidth)
        w.setframerate(rate)
        if sampwidth == 2:
            w.writeframes((frames * 32767).astype("<i2").tobytes())
        else:  # 8-bit unsigned
            w.writeframes((frames * 127 + 128).astype(np.uint8).tobytes())
    return out.getvalue()


def _float_wav(samples: object, rate: int) -> bytes:
    import numpy as np

    data = np.asarray(samples, dtype="<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def test_a_transcript_does_not_depend_on_the_requests_before_it(
    recognizer: PocketsphinxRecognizer, speaker: PiperSpeaker, speech: Speech
) -> None:
    first = recognizer.transcribe(speech.wav).text
    for other in ("Good morning.", "What is the weather like in Paris tomorrow?"):
        recognizer.transcribe(speaker.synthesize(other).wav)
        assert recognizer.transcribe(speech.wav).text == first


def test_any_rate_and_channel_count_is_recognised(
    recognizer: PocketsphinxRecognizer, speech: Speech
) -> None:
    audio = decode_wav(speech.wav)
    stereo_48k = _as_wav(resample(audio.samples, audio.sample_rate, 48000), 48000, channels=2)
    float_44k = _float_wav(resample(audio.samples, audio.sample_rate, 44100), 44100)
    for wav in (stereo_48k, float_44k):
        text = recognizer.transcribe(wav).text
        assert wer(SENTENCE, text) <= MAX_WER, text


def test_decode_wav_formats() -> None:
    need(NUMPY)
    import numpy as np

    tone = 0.5 * np.sin(np.linspace(0, 2 * np.pi * 50, 8000, dtype=np.float32))
    for wav in (_as_wav(tone, 8000, 1), _as_wav(tone, 8000, 3), _as_wav(tone, 8000, 1, 1)):
        audio = decode_wav(wav)
        assert audio.sample_rate == 8000
        assert np.max(np.abs(audio.samples - tone)) < 0.02
    audio = decode_wav(_float_wav(tone, 16000))
    assert np.array_equal(audio.samples, tone)
    up = resample(tone, 8000, 16000)
    assert len(up) == 16000
    assert abs(float(np.max(np.abs(up))) - 0.5) < 0.01


@pytest.mark.parametrize(
    "bad",
    [
        b"",
        b"not a wav file at all",
        b"RIFF\x24\x00\x00\x00WAVEfmt ",  # truncated
        b"RIFF\x04\x00\x00\x00WAVE",  # no chunks
        b"RIFF\x2c\x00\x00\x00WAVEfmt \x10\x00\x00\x00"
        + struct.pack("<HHIIHH", 1, 0, 16000, 32000, 2, 16)  # zero channels
        + b"data\x00\x00\x00\x00",
        b"RIFF\x2c\x00\x00\x00WAVEfmt \x10\x00\x00\x00"
        + struct.pack("<HHIIHH", 1, 1, 16000, 32000, 2, 16)  # no samples
        + b"data\x00\x00\x00\x00",
        b"RIFF\x2c\x00\x00\x00WAVEfmt \x10\x00\x00\x00"
        + struct.pack("<HHIIHH", 85, 1, 16000, 32000, 2, 16)  # MP3 inside WAV
        + b"data\x04\x00\x00\x00abcd",
    ],
)
def test_malformed_audio_is_a_request_error(recognizer: PocketsphinxRecognizer, bad: bytes) -> None:
    with pytest.raises(RequestError, match="audio") as err:
        recognizer.transcribe(bad)
    assert err.value.field == "audio"


@pytest.mark.parametrize("bad", ["", "   ", 42])
def test_empty_text_is_a_request_error(speaker: PiperSpeaker, bad: object) -> None:
    with pytest.raises(RequestError):
        speaker.synthesize(bad)  # type: ignore[arg-type]


def test_long_text_is_spoken_in_pieces(speaker: PiperSpeaker) -> None:
    text = " ".join(["the quick brown fox jumps over the lazy dog"] * 4)  # one 36-word sentence
    speech = speaker.synthesize(text)
    assert speech.duration_s > 6.0
