"""The Wyoming server: Home Assistant's voice protocol over the same Manager and backends.

Built on the ``wyoming`` package (one ``AsyncEventHandler`` per connection, its event
classes and writer): this module maps the events onto the services of ``server.wyoming``
(see :mod:`accelmux.config.wyoming`). Events are read by :mod:`.wyoming_frames`, the
package's framing with every size checked before it is read and every wait bounded; the
listener is asyncio's, with a cap on connections served at once.

* ``describe`` -> ``info``, built from the config alone (never from a model), so it is
  answered at once even while the device is full or a model is loading.
* ``transcribe`` + ``audio-start/chunk/stop`` -> ``transcript``. Audio of any rate, width
  and channel count is converted to 16 kHz 16-bit mono (``AudioChunkConverter``), wrapped
  in a WAV and sent to the ASR service as ``/v1/audio/transcriptions`` would be. At
  ``audio-start`` a service that is not resident starts loading (a zero-size request
  through the Manager, as the Ollama API's empty prompt does), so the load overlaps the
  utterance. Transcripts are not streamed: the ASR backend decodes whole utterances.
* ``synthesize`` -> ``audio-start/chunk/stop``; ``synthesize-start/chunk/stop`` is
  streamed sentence by sentence (each complete sentence is its own request as soon as
  its text has arrived), ending with ``synthesize-stopped``.

Every transcription and synthesis is admitted by the Manager through
:meth:`Runtime.call` with the class of its service (realtime in the default
stack): it queues, waits, is preempted or refused like any HTTP request. Every failure is
an ``error`` event with a text and a code (the policy's reason, ``no_asr_service``,
``no_tts_service``, ``bad_audio_format``, ``unknown_voice``, ``invalid_value``,
``audio_too_long``, ``text_too_long``, ``invalid_request``, ``backend_crashed``,
``backend_error``, ``internal_error``); the connection stays open. A broken frame or limit
(``malformed_event``, ``event_too_large``, ``event_timeout``, ``idle_timeout``) and a
connection over the cap (``too_many_connections``) are answered too, then closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import re
import socket
import time
import wave
from dataclasses import dataclass, field
from typing import Any

from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioChunkConverter, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_write_event
from wyoming.info import (
    AsrModel,
    AsrProgram,
    Attribution,
    Describe,
    Info,
    TtsProgram,
    TtsVoice,
)
from wyoming.ping import Ping, Pong
from wyoming.server import AsyncEventHandler
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
)
from zeroconf import IPVersion
from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

from accelmux import __version__
from accelmux.backends.base import BackendResponse
from accelmux.config.hosts import is_loopback
from accelmux.config.schema import AccelmuxConfig
from accelmux.config.wyoming import WyomingConfig
from accelmux.core.events import Demand
from accelmux.core.types import ServiceKind, ServiceStatus
from accelmux.errors import BackendCrashedError, BackendError
from accelmux.gateway.wyoming_frames import (
    FrameError,
    FrameLimits,
    WyomingError,
    json_kind,
    read_event,
)
from accelmux.runtime.call import Call
from accelmux.runtime.daemon import Runtime
from accelmux.runtime.requests import Refused

log = logging.getLogger("accelmux.wyoming")

#: What the ASR backend is given: Home Assistant's own format.
ASR_RATE, ASR_WIDTH, ASR_CHANNELS = 16000, 2, 1
#: Samples per ``audio-chunk`` of synthesised speech.
SAMPLES_PER_CHUNK = 1024
#: Formats an ``audio-chunk`` may carry (anything else is ``bad_audio_format``).
RATES = range(1000, 192001)
WIDTHS = (1, 2, 3, 4)
CHANNELS = range(1, 9)
ZEROCONF_TYPE = "_wyoming._tcp.local."
#: Who serves the programs (the models behind them are named by their services).
ATTRIBUTION = Attribution(name="accelmux", url="")
#: How long a closing ``error`` event may take to leave (the client may not be reading).
LAST_WORD_S = 1.0
#: At most one log line per this many seconds about connections refused over the cap.
REFUSED_LOG_EVERY_S = 10.0
_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+")


@dataclass(frozen=True, slots=True)
class VoicePlan:
    """Which services the server fronts and what ``info`` says (from the config only)."""

    asr: str | None
    tts: str | None
    asr_model: str
    tts_model: str
    voices: tuple[str, ...]
    languages: tuple[str, ...]
    name: str
    max_audio_bytes: int
    max_text_chars: int

    def info(self) -> Info:
        asr = []
        if self.asr is not None:
            model = AsrModel(
                name=self.asr_model,
                attribution=ATTRIBUTION,
                installed=True,
                description=f"accelmux service {self.asr}",
                version=None,
                languages=list(self.languages),
            )
            asr.append(
                AsrProgram(
                    name=self.name,
                    attribution=ATTRIBUTION,
                    installed=True,
                    description="speech-to-text through accelmux",
                    version=__version__,
                    models=[model],
                    supports_transcript_streaming=False,
                )
            )
        tts = []
        if self.tts is not None:
            voices = [
                TtsVoice(
                    name=voice,
                    attribution=ATTRIBUTION,
                    installed=True,
                    description=f"accelmux service {self.tts}",
                    version=None,
                    languages=list(self.languages),
                )
                for voice in self.voices
            ]
            tts.append(
                TtsProgram(
                    name=self.name,
                    attribution=ATTRIBUTION,
                    installed=True,
                    description="text-to-speech through accelmux",
                    version=__version__,
                    voices=voices,
                    supports_synthesize_streaming=True,
                )
            )
        return Info(asr=asr, tts=tts)


def _first(cfg: AccelmuxConfig, kind: ServiceKind) -> str | None:
    return next((n for n, s in cfg.services.items() if s.kind is kind), None)


def voice_plan(cfg: AccelmuxConfig, wy: WyomingConfig) -> VoicePlan:
    asr = wy.asr or _first(cfg, ServiceKind.ASR)
    tts = wy.tts or _first(cfg, ServiceKind.TTS)
    asr_model = (cfg.services[asr].model or asr) if asr is not None else ""
    tts_model = (cfg.services[tts].model or tts) if tts is not None else ""
    voices: list[str] = list(wy.voices)
    if not voices and tts is not None:
        svc = cfg.services[tts]
        voices = [svc.model or tts, *svc.aliases]
    return VoicePlan(
        asr=asr,
        tts=tts,
        asr_model=asr_model,
        tts_model=tts_model,
        voices=tuple(dict.fromkeys(voices)),
        languages=tuple(wy.languages),
        name=wy.name,
        max_audio_bytes=wy.max_utterance_bytes,
        max_text_chars=wy.max_text_chars,
    )


def split_sentences(text: str) -> tuple[list[str], str]:
    """The complete sentences of ``text`` and the rest (a sentence still arriving)."""
    parts = _SENTENCE_END.split(text)
    done = [p.strip() for p in parts[:-1] if p.strip()]
    return done, parts[-1]


def pcm_wav(pcm: bytes, rate: int = ASR_RATE, width: int = ASR_WIDTH, channels: int = 1) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(pcm)
    return buf.getvalue()


def wav_events(wav: bytes) -> tuple[AudioStart, list[AudioChunk]]:
    """The ``audio-start`` and ``audio-chunk`` events of a WAV file."""
    try:
        with wave.open(io.BytesIO(wav), "rb") as w:
            rate, width, channels = w.getframerate(), w.getsampwidth(), w.getnchannels()
            frames = w.readframes(w.getnframes())
    except (wave.Error, EOFError) as exc:
        raise WyomingError("backend_error", f"the TTS answer is not a WAV: {exc}") from None
    step = SAMPLES_PER_CHUNK * width * channels
    chunks = [
        AudioChunk(rate=rate, width=width, channels=channels, audio=frames[i : i + step])
        for i in range(0, len(frames), step)
    ]
    return AudioStart(rate=rate, width=width, channels=channels), chunks


def _check_format(chunk: AudioChunk) -> None:
    if chunk.rate not in RATES or chunk.width not in WIDTHS or chunk.channels not in CHANNELS:
        raise WyomingError(
            "bad_audio_format",
            f"unsupported audio format: rate {chunk.rate} Hz, width {chunk.width} bytes, "
            f"{chunk.channels} channels (rate 1000..192000, width 1..4, channels 1..8)",
        )
    if len(chunk.audio) % (chunk.width * chunk.channels):
        raise WyomingError(
            "bad_audio_format",
            f"audio-chunk of {len(chunk.audio)} bytes is not whole frames of "
            f"{chunk.width * chunk.channels} bytes",
        )


def _invalid(event: Event, name: str, want: str) -> WyomingError:
    if name not in event.data:
        return WyomingError("invalid_value", f"{event.type}: '{name}' is missing ({want})")
    got = json_kind(event.data[name])
    return WyomingError("invalid_value", f"{event.type}: '{name}' must be {want} (got {got})")


def text_field(event: Event) -> str:
    """The ``text`` of a ``synthesize`` or ``synthesize-chunk``: a string."""
    value = event.data.get("text")
    if not isinstance(value, str):
        raise _invalid(event, "text", "a string")
    return value


def optional_str(event: Event, name: str) -> str | None:
    value = event.data.get(name)
    if value is not None and not isinstance(value, str):
        raise _invalid(event, name, "a string")
    return value


def voice_name(event: Event) -> str | None:
    """The voice a ``synthesize(-start)`` names (``voice.name``), or None."""
    voice = event.data.get("voice")
    if voice is None:
        return None
    if not isinstance(voice, dict):
        raise _invalid(event, "voice", "an object")
    name = voice.get("name")
    if name is not None and not isinstance(name, str):
        kind = json_kind(name)
        raise WyomingError(
            "invalid_value", f"{event.type}: 'voice.name' must be a string (got {kind})"
        )
    return name


def audio_format(event: Event) -> tuple[int, int, int]:
    """``rate``, ``width`` and ``channels`` of an ``audio-start`` or ``audio-chunk``."""
    values = []
    for name in ("rate", "width", "channels"):
        value = event.data.get(name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise _invalid(event, name, "an integer")
        values.append(value)
    return values[0], values[1], values[2]


def audio_chunk(event: Event) -> AudioChunk:
    rate, width, channels = audio_format(event)
    return AudioChunk(rate=rate, width=width, channels=channels, audio=event.payload or b"")


def refusal_error(exc: Refused) -> WyomingError:
    detail = exc.action.detail
    retry = exc.retry_after_s
    text = f"refused by the policy: {exc.reason.value}" + (f": {detail}" if detail else "")
    if retry:
        text += f" (retry after {retry:g} s)"
    return WyomingError(exc.reason.value, text)


@dataclass(slots=True)
class _Utterance:
    converter: AudioChunkConverter
    pcm: bytearray = field(default_factory=bytearray)
    failed: bool = False


class VoiceHandler(AsyncEventHandler):
    """One Wyoming connection."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        runtime: Runtime,
        plan: VoicePlan,
        info: Event,
        tasks: set[asyncio.Task[Any]],
        limits: FrameLimits,
    ) -> None:
        super().__init__(reader, writer)
        self.rt = runtime
        self.plan = plan
        self.info = info
        self.tasks = tasks
        self.limits = limits
        self.language: str | None = None
        self.utterance: _Utterance | None = None
        self.stream_text: str | None = None  # synthesize-start .. stop
        self.stream_voice: str | None = None
        self.stream_started = False
        self.stream_chars = 0  # all the text of the stream so far
        self.stream_failed = False  # over max_text_chars: the rest is dropped

    async def run(self) -> None:
        """Events until the client closes, breaks the framing or a limit, or goes silent:
        each of those is answered with an ``error`` event, then the connection closes."""
        self._is_running = True
        try:
            while self._is_running:
                try:
                    event = await read_event(self.reader, self.limits)
                except FrameError as exc:
                    self._log_closing(exc)
                    await self._last_word(exc.event())
                    break
                if event is None or not await self.handle_event(event):
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away
        finally:
            await self.disconnect()
            self.writer.close()

    def _log_closing(self, exc: FrameError) -> None:
        peer = self.writer.get_extra_info("peername")
        level = logging.DEBUG if exc.code == "idle_timeout" else logging.WARNING
        log.log(level, "wyoming: closing the connection of %s: %s", peer, exc.text)

    async def _last_word(self, event: Event) -> None:
        """Say why the connection closes, unless the client is not reading."""
        with contextlib.suppress(OSError, TimeoutError):  # the client is gone or not reading
            async with asyncio.timeout(LAST_WORD_S):
                await async_write_event(event, self.writer)

    async def write_event(self, event: Event) -> None:
        """Send an event; a client that reads nothing for ``event_timeout_s`` is gone."""
        try:
            async with asyncio.timeout(self.limits.event_timeout_s):
                await async_write_event(event, self.writer)
        except TimeoutError:
            raise ConnectionAbortedError(
                f"the client read nothing for {self.limits.event_timeout_s:g} s"
            ) from None

    async def handle_event(self, event: Event) -> bool:
        try:
            try:
                await self._dispatch(event)
            except WyomingError as exc:
                await self.write_event(exc.event())
            except (ConnectionError, asyncio.IncompleteReadError):
                raise
            except Exception:
                log.exception("wyoming: %s failed", event.type)
                text = f"internal error handling {event.type} (logged)"
                await self.write_event(Error(text=text, code="internal_error").event())
        except (ConnectionError, asyncio.IncompleteReadError):
            return False  # the client went away
        return True

    async def _dispatch(self, event: Event) -> None:
        if Describe.is_type(event.type):
            await self.write_event(self.info)
        elif Ping.is_type(event.type):
            await self.write_event(Pong(text=Ping.from_event(event).text).event())
        elif Transcribe.is_type(event.type):
            self._need(self.plan.asr, "no_asr_service", "speech-to-text")
            self.language = optional_str(event, "language")
        elif AudioStart.is_type(event.type):
            service = self._need(self.plan.asr, "no_asr_service", "speech-to-text")
            audio_format(event)
            self.utterance = _Utterance(AudioChunkConverter(ASR_RATE, ASR_WIDTH, ASR_CHANNELS))
            self._warm(service)
        elif AudioChunk.is_type(event.type):
            self._chunk(audio_chunk(event))
        elif AudioStop.is_type(event.type):
            utterance, self.utterance = self.utterance, None
            if utterance is not None and not utterance.failed:
                text = await self._transcribe(bytes(utterance.pcm))
                await self.write_event(Transcript(text=text, language=self.language).event())
        elif SynthesizeStart.is_type(event.type):
            service = self._need(self.plan.tts, "no_tts_service", "text-to-speech")
            self.stream_voice = self._voice(voice_name(event))
            self.stream_text, self.stream_started = "", False
            self.stream_chars, self.stream_failed = 0, False
            self._warm(service)
        elif SynthesizeChunk.is_type(event.type):
            text = text_field(event)
            if self.stream_text is not None:
                await self._stream_chunk(text)
        elif SynthesizeStop.is_type(event.type):
            await self._stream_stop()
        elif Synthesize.is_type(event.type):
            text = text_field(event)
            if self.stream_text is not None:
                return  # the compatibility copy of a streamed text: already spoken
            self._need(self.plan.tts, "no_tts_service", "text-to-speech")
            voice = self._voice(voice_name(event))
            self._check_text_length(len(text), "the text")
            await self._speak(text, voice, start=True, stop=True)

    # ---- helpers -----------------------------------------------------------------------
    def _need(self, service: str | None, code: str, what: str) -> str:
        if service is None:
            raise WyomingError(code, f"accelmux serves no {what} here (no such service)")
        return service

    def _voice(self, name: str | None) -> str | None:
        if name is not None and name not in self.plan.voices:
            raise WyomingError(
                "unknown_voice",
                f"unknown voice {name!r}; voices: {', '.join(self.plan.voices)}",
            )
        return name

    def _check_text_length(self, chars: int, what: str) -> None:
        cap = self.plan.max_text_chars
        if chars > cap:
            raise WyomingError(
                "text_too_long",
                f"{what} has more than {cap} characters (server.wyoming.max_text_chars)",
            )

    def _warm(self, service: str) -> None:
        """Start loading ``service`` through the Manager unless it is resident."""
        status = self.rt.service_state(service).status
        if status in (ServiceStatus.LOADED, ServiceStatus.LOADING):
            return

        async def warm() -> None:
            with contextlib.suppress(Refused, BackendError):
                await self.rt.load(service)

        task = asyncio.create_task(warm())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _chunk(self, chunk: AudioChunk) -> None:
        utterance = self.utterance
        if utterance is None:
            self._need(self.plan.asr, "no_asr_service", "speech-to-text")
            utterance = self.utterance = _Utterance(
                AudioChunkConverter(ASR_RATE, ASR_WIDTH, ASR_CHANNELS)
            )
        if utterance.failed:
            return
        try:
            _check_format(chunk)
            pcm = utterance.converter.convert(chunk).audio
        except WyomingError:
            utterance.failed = True
            raise
        except Exception as exc:  # audioop rejects what it cannot convert
            utterance.failed = True
            raise WyomingError("bad_audio_format", f"cannot convert the audio: {exc}") from None
        if len(utterance.pcm) + len(pcm) > self.plan.max_audio_bytes:
            utterance.failed = True
            utterance.pcm = bytearray()
            seconds = self.plan.max_audio_bytes / (ASR_RATE * ASR_WIDTH)
            raise WyomingError(
                "audio_too_long",
                f"the utterance is longer than {seconds:g} s (server.wyoming.max_utterance_s): "
                "dropped",
            )
        utterance.pcm += pcm

    async def _transcribe(self, pcm: bytes) -> str:
        service = self._need(self.plan.asr, "no_asr_service", "speech-to-text")
        seconds = len(pcm) / (ASR_RATE * ASR_WIDTH)
        answer = await self._run(
            service,
            "/v1/audio/transcriptions",
            {"model": self.plan.asr_model, "response_format": "text"},
            Demand(units=seconds),
            files={"file": pcm_wav(pcm)},
        )
        return answer.body.decode("utf-8", "replace").strip()

    async def _speak(self, text: str, voice: str | None, *, start: bool, stop: bool) -> None:
        service = self._need(self.plan.tts, "no_tts_service", "text-to-speech")
        if text.strip():
            body: dict[str, Any] = {"model": self.plan.tts_model, "input": text}
            body["response_format"] = "wav"
            if voice is not None:
                body["voice"] = voice
            answer = await self._run(service, "/v1/audio/speech", body, Demand(units=len(text)))
            audio_start, chunks = wav_events(answer.body)
            if start:
                await self.write_event(audio_start.event())
            for chunk in chunks:
                await self.write_event(chunk.event())
        elif start:  # nothing to say: an empty stream of the voice's usual format
            await self.write_event(AudioStart(rate=ASR_RATE, width=ASR_WIDTH, channels=1).event())
        if stop:
            await self.write_event(AudioStop().event())

    async def _stream_chunk(self, text: str) -> None:
        assert self.stream_text is not None
        if self.stream_failed:
            return
        self.stream_chars += len(text)
        try:
            self._check_text_length(self.stream_chars, "the streamed text")
        except WyomingError:
            self.stream_failed, self.stream_text = True, ""
            raise
        sentences, self.stream_text = split_sentences(self.stream_text + text)
        for sentence in sentences:
            first = not self.stream_started
            await self._speak(sentence, self.stream_voice, start=first, stop=False)
            self.stream_started = True

    async def _stream_stop(self) -> None:
        if self.stream_text is None:
            return
        rest, self.stream_text = self.stream_text, None
        started, self.stream_started = self.stream_started, False
        if self.stream_failed:  # its error was sent: only the end of the stream is left
            await self.write_event(SynthesizeStopped().event())
            return
        try:
            await self._speak(rest, self.stream_voice, start=not started, stop=True)
        except WyomingError as exc:
            await self.write_event(exc.event())
        await self.write_event(SynthesizeStopped().event())

    async def _run(
        self,
        service: str,
        endpoint: str,
        body: dict[str, Any],
        demand: Demand,
        files: dict[str, bytes] | None = None,
    ) -> BackendResponse:
        """One request through the Manager, as the HTTP gateway sends it."""
        rt = self.rt
        kind = rt.service_state(service).spec.kind
        rid = rt.new_request_id()
        files = files or {}
        call = Call(
            kind=kind,
            endpoint=endpoint,
            body=body,
            files=files,
            file_info={k: (f"{k}.wav", "audio/wav") for k in files},
        )
        try:
            answer = await rt.call(
                service, demand, call, request_id=rid, label="wyoming:" + endpoint
            )
        except Refused as exc:
            raise refusal_error(exc) from None
        except BackendError as exc:
            outcome = "backend_crashed" if isinstance(exc, BackendCrashedError) else "backend_error"
            raise WyomingError(outcome, f"the {service} backend failed: {exc}") from None
        if answer.status >= 400:
            text = answer.body.decode("utf-8", "replace")[:500]
            code = "invalid_request" if answer.status < 500 else "backend_error"
            raise WyomingError(code, f"{service} answered {answer.status}: {text}")
        return answer


class WyomingServer:
    """The listening server, its connection cap and (optionally) its zeroconf
    advertisement. The listener is asyncio's own (``asyncio.start_server``), not the
    package's ``AsyncTcpServer``: its stream limit is ``max_header_bytes``, and a
    connection over ``max_connections`` is answered and closed before a handler exists."""

    def __init__(self, runtime: Runtime, wy: WyomingConfig) -> None:
        self.rt = runtime
        self.cfg = wy
        self.plan = voice_plan(runtime.cfg, wy)
        self.info = self.plan.info().event()
        self.limits = FrameLimits.of(wy)
        self.tasks: set[asyncio.Task[Any]] = set()
        #: the connections being served, by the task that serves each
        self.connections: dict[asyncio.Task[Any], VoiceHandler] = {}
        self._server: asyncio.Server | None = None
        self._refused = 0  # over the cap, since the last log line about it
        self._refused_logged = float("-inf")
        self._lingering = 0  # refused connections being closed gracefully
        self._zeroconf: AsyncZeroconf | None = None
        self._service_info: AsyncServiceInfo | None = None

    def handler(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> VoiceHandler:
        return VoiceHandler(
            reader,
            writer,
            runtime=self.rt,
            plan=self.plan,
            info=self.info,
            tasks=self.tasks,
            limits=self.limits,
        )

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._connected, self.cfg.host, self.cfg.port, limit=self.limits.max_header_bytes
        )
        log.info(
            "wyoming listening on tcp://%s:%d (asr: %s, tts: %s)",
            self.cfg.host,
            self.cfg.port,
            self.plan.asr or "none",
            self.plan.tts or "none",
        )
        if self.cfg.zeroconf:
            await self._advertise()

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self.connections) >= self.cfg.max_connections:
            await self._refuse(reader, writer)
            return
        task = asyncio.current_task()
        assert task is not None
        handler = self.handler(reader, writer)
        self.connections[task] = handler
        try:
            await handler.run()
        finally:
            self.connections.pop(task, None)

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer a connection over the cap with an ``error`` event and close it.

        What the client sent meanwhile (its ``describe``) is read and dropped for up to
        ``LAST_WORD_S`` (at most ``max_connections`` such closes at once), so that the
        close is a FIN after the answer rather than a reset that may discard it."""
        cap = self.cfg.max_connections
        self._refused += 1
        now = time.monotonic()
        if now - self._refused_logged >= REFUSED_LOG_EVERY_S:
            log.warning(
                "wyoming: %d connection(s) refused: %d served already "
                "(server.wyoming.max_connections)",
                self._refused,
                cap,
            )
            self._refused, self._refused_logged = 0, now
        text = (
            f"the server serves {cap} connections already (server.wyoming.max_connections): "
            "try again later"
        )
        with contextlib.suppress(OSError, TimeoutError):  # the client is gone or not reading
            async with asyncio.timeout(LAST_WORD_S):
                await async_write_event(
                    Error(text=text, code="too_many_connections").event(), writer
                )
                writer.write_eof()
            if self._lingering < cap:
                self._lingering += 1
                try:
                    async with asyncio.timeout(LAST_WORD_S):
                        while await reader.read(64 * 1024):
                            pass
                finally:
                    self._lingering -= 1
        writer.close()

    async def _advertise(self) -> None:
        if is_loopback(self.cfg.host):
            log.warning(
                "wyoming: zeroconf is on but server.wyoming.host %s is loopback: "
                "Home Assistant could not connect; not advertised",
                self.cfg.host,
            )
            return
        address = advertised_address(self.cfg.host)
        info = AsyncServiceInfo(
            ZEROCONF_TYPE,
            f"{self.cfg.name}.{ZEROCONF_TYPE}",
            addresses=[socket.inet_aton(address)],
            port=self.cfg.port,
        )
        zc = AsyncZeroconf(ip_version=IPVersion.V4Only)
        try:
            await zc.async_register_service(info)
        except Exception as exc:  # no multicast here: serve on, undiscovered
            log.warning("wyoming: zeroconf advertisement failed: %s", exc)
            await zc.async_close()
            return
        self._zeroconf, self._service_info = zc, info
        log.info("wyoming: advertised %s at %s:%d", info.name, address, self.cfg.port)

    async def stop(self) -> None:
        if self._zeroconf is not None:
            with contextlib.suppress(Exception):
                if self._service_info is not None:
                    await self._zeroconf.async_unregister_service(self._service_info)
                await self._zeroconf.async_close()
            self._zeroconf = None
        if self._server is not None:
            self._server.close()
        await asyncio.gather(*(h.stop() for h in list(self.connections.values())))
        for task in list(self.tasks):
            task.cancel()
        for task in list(self.tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def advertised_address(host: str) -> str:
    """The IPv4 address to advertise: ``host`` itself, or for a wildcard host the
    address of the interface that routes to the mDNS group."""
    if host not in ("", "0.0.0.0", "::"):
        return host
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        sock.connect(("224.0.0.251", 5353))
        return str(sock.getsockname()[0])
