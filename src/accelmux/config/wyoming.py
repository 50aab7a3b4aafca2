"""The ``server.wyoming:`` section: a Wyoming server (Home Assistant's voice protocol).

One port serves both speech-to-text and text-to-speech (Home Assistant's Wyoming
integration makes an STT and a TTS entity from one server whose ``info`` lists both).
Off unless configured; loopback by default. Wyoming has no authentication, so a
non-loopback host needs ``allow_network``; every size and wait a client controls has a
cap here (one event's header line, data and payload; one utterance; one text; how long
an event may take to arrive and a connection may sit silent; how many connections).
"""

from __future__ import annotations

from pydantic import BaseModel, ByteSize, ConfigDict, Field

from accelmux.config.hosts import is_loopback

#: Bytes a second of the audio the ASR service is given (16 kHz, 16-bit, mono).
ASR_BYTES_PER_S = 16000 * 2
#: The conventional port of a Wyoming speech-to-text server (wyoming-faster-whisper).
WYOMING_STT_PORT = 10300


class WyomingConfig(BaseModel):
    """Where the Wyoming server listens and which services it fronts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(
        "127.0.0.1",
        description="Listen address (loopback by default); any other address needs allow_network.",
    )
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
    allow_network: bool = Field(
        False,
        description="Listen on a non-loopback host although Wyoming has no authentication: "
        "anyone who reaches the port can use the speech services. Without it (or "
        "server.allow_unauthenticated, serve --allow-open) serve refuses such a host.",
    )
    max_connections: int = Field(
        32,
        ge=1,
        le=100_000,
        description="Wyoming connections served at once; one more is answered with an "
        "error event (too_many_connections) and closed. Home Assistant opens one per "
        "request.",
    )
    idle_timeout_s: float = Field(
        60.0,
        gt=0,
        le=86_400,
        description="A connection with no event for this long is closed (idle_timeout "
        "error event). Counted only while the server waits for the client.",
    )
    event_timeout_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="Once an event's first byte has arrived, its header line, data and "
        "payload must all arrive within this time, else event_timeout and close; a client "
        "that takes none of an answer for this long is disconnected too.",
    )
    max_header_bytes: ByteSize = Field(
        ByteSize(64 * 1024),
        ge=1024,
        le=16 * 1024**2,
        description="Longest header line of one event (its JSON, up to the newline).",
    )
    max_data_bytes: ByteSize = Field(
        ByteSize(256 * 1024),
        ge=1024,
        le=64 * 1024**2,
        description="Largest data section of one event (data_length), checked before reading it.",
    )
    max_payload_bytes: ByteSize = Field(
        ByteSize(1024**2),
        ge=1024,
        le=1024**3,
        description="Largest payload of one event (payload_length, the audio of one "
        "audio-chunk), checked before reading it; 1 MiB is 32 s of 16 kHz 16-bit mono "
        "(Home Assistant's chunks are a few KiB).",
    )
    max_utterance_s: float = Field(
        300.0,
        gt=0,
        le=3600,
        description="Longest audio of one transcription (the audio-chunks up to "
        "audio-stop, once converted to 16 kHz 16-bit mono: 32 kB a second); beyond it an "
        "audio_too_long error event and the utterance is dropped.",
    )
    max_text_chars: int = Field(
        10_000,
        ge=1,
        le=10_000_000,
        description="Longest text of one synthesize, and of one streamed synthesis "
        "(synthesize-start .. stop) in all; beyond it a text_too_long error event.",
    )

    @property
    def max_utterance_bytes(self) -> int:
        """``max_utterance_s`` as bytes of 16 kHz 16-bit mono."""
        return int(self.max_utterance_s * ASR_BYTES_PER_S)


def open_network_problem(wy: WyomingConfig, *, allow_unauthenticated: bool = False) -> str | None:
    """Why ``wy`` must not listen where it would (a non-loopback host without an opt-in),
    or None. Wyoming has no keys: whoever reaches the port uses the speech services."""
    if wy.allow_network or allow_unauthenticated or is_loopback(wy.host):
        return None
    where = wy.host or "every address"
    return (
        f"server.wyoming.host: {where} is not loopback and Wyoming has no authentication: "
        f"anyone who reaches port {wy.port} could use the speech services. Listen on "
        "127.0.0.1, or accept it with server.wyoming.allow_network: true "
        "(server.allow_unauthenticated, serve --allow-open, accepts it too)"
    )
