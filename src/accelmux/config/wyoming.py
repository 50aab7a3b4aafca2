"""The ``server.wyoming:`` section: a Wyoming server (Home Assistant's voice protocol).

One port serves both speech-to-text and text-to-speech (Home Assistant's Wyoming
integration makes an STT and a TTS entity from one server whose ``info`` lists both).
Off unless configured; loopback by default.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

#: The conventional port of a Wyoming speech-to-text server (wyoming-faster-whisper).
WYOMING_STT_PORT = 10300


class WyomingConfig(BaseModel):
    """Where the Wyoming server listens and which services it fronts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field("127.0.0.1", description="Listen address (loopback by default).")
    port: int = Field(
        WYOMING_STT_PORT, ge=1, le=65535, description="One port for speech-to-text and speech."
    )
    asr: str | None = Field(
        None,
        description="The ASR service behind transcribe (default: the first asr service).",
    )
    tts: str | None = Field(
        None,
        description="The TTS service behind synthesize (default: the first tts service).",
    )
    languages: list[str] = Field(
        ["en"],
        min_length=1,
        description="Languages announced in info for the ASR model and the TTS voices.",
    )
    voices: list[str] = Field(
        default_factory=list,
        description="Voice names announced in info (default: the TTS service's model name "
        "and aliases); a synthesize naming another voice gets an error event.",
    )
    zeroconf: bool = Field(
        False,
        description="Advertise _wyoming._tcp.local. for Home Assistant discovery "
        "(needs a non-loopback host).",
    )
    name: str = Field("accelmux", description="Program name in info and the zeroconf name.")
