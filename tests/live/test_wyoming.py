"""The Wyoming server against fake backends, spoken by the ``wyoming`` package's own
client: describe, transcribe (with resampling), synthesize (plain and streamed), the load
at audio-start, and every failure as an ``error`` event on a connection that stays open."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import math
import signal
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.live.support import Live, base_config, daemon, fake, free_port, live, run, settle
from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event, async_read_event
from wyoming.info import Describe, Info
from wyoming.ping import Ping, Pong
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
    SynthesizeVoice,
)

from accelmux.backends.base import BackendRequest, BackendResponse
from accelmux.config.load import load_config_data, semantic_problems
from accelmux.config.wyoming import WyomingConfig
from accelmux.core.types import ServiceStatus
from accelmux.errors import ConfigError
from accelmux.gateway.wyoming_api import WyomingServer, advertised_address, split_sentences

TIMEOUT = 5.0


def tone(seconds: float, rate: int, channels: int = 1, width: int = 2) -> bytes:
    """A 440 Hz tone as little-endian PCM."""
    frames = []
    peak = 2 ** (8 * width - 1) - 1
    for i in range(int(seconds * rate)):
        value = int(0.3 * peak * math.sin(2 * math.pi * 440 * i / rate))
        sample = value.to_bytes(width, "little", signed=True)
        frames.append(sample * channels)
    return b"".join(frames)


@contextlib.asynccontextmanager
async def wyoming(
    config: dict[str, Any] | None = None, *, tmp: Path, **wy: Any
) -> AsyncIterator[tuple[Live, WyomingServer]]:
    data = copy.deepcopy(config or base_config())
    async with live(data, tmp=tmp) as lv:
        server = WyomingServer(lv.runtime, WyomingConfig(port=free_port(), **wy))
        await server.start()
        try:
            yield lv, server
        finally:
            await server.stop()


@contextlib.asynccontextmanager
async def client(server: WyomingServer) -> AsyncIterator[AsyncTcpClient]:
    async with AsyncTcpClient(server.cfg.host, server.cfg.port) as c:
        yield c


async def read(c: AsyncTcpClient) -> Event:
    event = await asyncio.wait_for(c.read_event(), TIMEOUT)
    assert event is not None, "the server closed the connection"
    return event


async def read_until(c: AsyncTcpClient, last: str) -> list[Event]:
    events = [await read(c)]
    while events[-1].type not in (last, "error"):
        events.append(await read(c))
    return events


async def transcribe(c: AsyncTcpClient, pcm: bytes, rate: int, width: int, channels: int) -> Event:
    await c.write_event(Transcribe(language="en").event())
    await c.write_event(AudioStart(rate=rate, width=width, channels=channels).event())
    step = 1024 * width * channels
    for i in range(0, len(pcm), step):
        chunk = AudioChunk(rate=rate, width=width, channels=channels, audio=pcm[i : i + step])
        await c.write_event(chunk.event())
    await c.write_event(AudioStop().event())
    return await read(c)


def record_requests(lv: Live, service: str) -> list[BackendRequest]:
    """Wrap the service's backend so the test sees every request it is given."""
    backend = lv.runtime.backends[service]
    seen: list[BackendRequest] = []
    handle = backend.handle

    async def recording(request: BackendRequest) -> BackendResponse:
        seen.append(request)
        return await handle(request)

    backend.handle = recording  # type: ignore[method-assign]
    return seen


def test_describe_lists_asr_and_tts_from_the_config(tmp_path: Path) -> None:
    async def body() -> None:
        async with wyoming(tmp=tmp_path, languages=["en", "de"]) as (_, server):
            async with client(server) as c:
                await c.write_event(Describe().event())
                info = Info.from_event(await read(c))
            assert [p.models[0].name for p in info.asr] == ["asr"]
            assert info.asr[0].models[0].languages == ["en", "de"]
            assert info.asr[0].installed and not info.asr[0].supports_transcript_streaming
            assert [v.name for v in info.tts[0].voices] == ["tts"]
            assert info.tts[0].supports_synthesize_streaming

    run(body())


def test_describe_answers_at_once_while_a_load_hangs_and_the_device_is_full(
    tmp_path: Path,
) -> None:
    config = base_config()
    config["devices"]["gpu"]["capacity"] = "1GiB"
    tts = config["services"]["tts"]
    tts.update(residency="warm", memory={"weights": "600MiB"}, backend=fake(hang_load=True))
    config["services"]["chat"]["memory"]["weights"] = "700MiB"

    async def body() -> None:
        async with wyoming(config, tmp=tmp_path) as (lv, server):
            state = lv.runtime.manager.world.services
            async with client(server) as c:
                await c.write_event(SynthesizeStart().event())  # starts the hanging load
                await settle(lambda: state["tts"].status is ServiceStatus.LOADING)
                for _ in range(3):
                    async with client(server) as d:
                        started = time.perf_counter()
                        await d.write_event(Describe().event())
                        info = Info.from_event(await read(d))
                        assert time.perf_counter() - started < 1.0
                        assert info.tts and info.asr

    run(body())


def test_transcribe_converts_any_format_to_16khz_mono(tmp_path: Path) -> None:
    async def body() -> None:
        async with wyoming(tmp=tmp_path) as (lv, server):
            seen = record_requests(lv, "asr")
            async with client(server) as c:
                event = await transcribe(c, tone(1.0, 48000, channels=2), 48000, 2, 2)
                text = Transcript.from_event(event).text
                event = await transcribe(c, tone(0.5, 16000), 16000, 2, 1)
            # the fake ASR names the size of the WAV it got: 44-byte header + 16 kHz s16 mono
            assert text.startswith("fake transcript of")
            sizes = [len(r.files["file"]) for r in seen]
            assert abs(sizes[0] - (44 + 32000)) <= 8 and sizes[1] == 44 + 16000
            assert Transcript.from_event(event).language == "en"
            assert all(r.endpoint == "/v1/audio/transcriptions" for r in seen)

    run(body())


def test_audio_start_loads_an_unloaded_asr_while_the_audio_arrives(tmp_path: Path) -> None:
    config = base_config()
    config["services"]["asr"].update(residency="on-demand", backend=fake(load_s=0.3))

    async def body() -> None:
        async with wyoming(config, tmp=tmp_path) as (lv, server):
            state = lv.runtime.manager.world.services["asr"]
            assert state.status is ServiceStatus.UNLOADED
            async with client(server) as c:
                await c.write_event(Transcribe().event())
                await c.write_event(AudioStart(rate=16000, width=2, channels=1).event())
                await settle(lambda: state.status is not ServiceStatus.UNLOADED)
                chunk = AudioChunk(rate=16000, width=2, channels=1, audio=tone(0.2, 16000))
                await c.write_event(chunk.event())
                await c.write_event(AudioStop().event())
                assert Transcript.is_type((await read(c)).type)

    run(body())


def test_synthesize_returns_audio_in_the_voice_format(tmp_path: Path) -> None:
    async def body() -> None:
        async with wyoming(tmp=tmp_path) as (_, server), client(server) as c:
            text = "The kitchen lights are on."
            await c.write_event(Synthesize(text=text, voice=SynthesizeVoice(name="tts")).event())
            events = await read_until(c, "audio-stop")
            start = AudioStart.from_event(events[0])
            chunks = [AudioChunk.from_event(e) for e in events[1:-1]]
            assert AudioStop.is_type(events[-1].type)
            assert (start.rate, start.width, start.channels) == (16000, 2, 1)
            audio = b"".join(c.audio for c in chunks)
            # the fake TTS speaks 0.2 s + 10 ms per character
            assert len(audio) == int(16000 * (0.2 + len(text) * 0.01)) * 2

    run(body())


def test_streamed_synthesis_speaks_each_sentence_once(tmp_path: Path) -> None:
    async def body() -> None:
        async with wyoming(tmp=tmp_path) as (lv, server):
            seen = record_requests(lv, "tts")
            async with client(server) as c:
                await c.write_event(SynthesizeStart().event())
                for part in ("Hello there. How are", " you today? Fine", " thanks"):
                    await c.write_event(SynthesizeChunk(text=part).event())
                full = "Hello there. How are you today? Fine thanks"
                await c.write_event(Synthesize(text=full).event())  # the compatibility copy
                await c.write_event(SynthesizeStop().event())
                events = await read_until(c, "synthesize-stopped")
            types = [e.type for e in events]
            assert types.count("audio-start") == 1 and types[0] == "audio-start"
            assert types[-2:] == ["audio-stop", "synthesize-stopped"]
            assert [r.body["input"] for r in seen] == [
                "Hello there.",
                "How are you today?",
                "Fine thanks",
            ]
            assert SynthesizeStopped.is_type(events[-1].type)

    run(body())


def test_refusal_by_the_policy_is_an_error_event_with_its_reason(tmp_path: Path) -> None:
    config = base_config()
    tts = config["services"]["tts"]
    tts.update(concurrency=1, queue={"limit": 0, "deadline_s": 5}, backend=fake(latency_s=0.5))

    async def body() -> None:
        async with wyoming(config, tmp=tmp_path) as (lv, server):
            world = lv.runtime.manager.world
            async with client(server) as first, client(server) as second:
                await first.write_event(Synthesize(text="One moment please.").event())
                await settle(lambda: world.inflight)
                await second.write_event(Synthesize(text="And me?").event())
                err = Error.from_event(await read(second))
                assert err.code == "queue_full" and "refused by the policy" in err.text
                events = await read_until(first, "audio-stop")
                assert events[-1].type == "audio-stop"
                # the refused connection is still open and served
                await second.write_event(Synthesize(text="Now?").event())
                assert (await read_until(second, "audio-stop"))[-1].type == "audio-stop"

    run(body())


def test_bad_audio_and_unknown_voice_are_errors_on_an_open_connection(tmp_path: Path) -> None:
    async def body() -> None:
        async with wyoming(tmp=tmp_path) as (_, server), client(server) as c:
            await c.write_event(AudioStart(rate=16000, width=2, channels=1).event())
            await c.write_event(AudioChunk(rate=16000, width=2, channels=1, audio=b"abc").event())
            assert Error.from_event(await read(c)).code == "bad_audio_format"
            await c.write_event(AudioChunk(rate=16000, width=7, channels=1, audio=b"").event())
            await c.write_event(AudioStop().event())  # the failed utterance is dropped
            await c.write_event(Synthesize(text="hi", voice=SynthesizeVoice(name="nope")).event())
            err = Error.from_event(await read(c))
            assert err.code == "unknown_voice" and "tts" in err.text
            await c.write_event(Ping(text="still there").event())
            assert Pong.from_event(await read(c)).text == "still there"

    run(body())


def test_without_asr_service_transcribe_is_an_error(tmp_path: Path) -> None:
    config = base_config()
    del config["services"]["asr"]

    async def body() -> None:
        async with wyoming(config, tmp=tmp_path) as (_, server), client(server) as c:
            await c.write_event(Describe().event())
            assert not Info.from_event(await read(c)).asr
            await c.write_event(Transcribe().event())
            err = Error.from_event(await read(c))
            assert err.code == "no_asr_service" and "speech-to-text" in err.text

    run(body())


def test_config_checks_the_services_and_the_port(tmp_path: Path) -> None:
    data = base_config()
    data["server"].update(port=8600, wyoming={"asr": "tts", "tts": "missing", "port": 8600})
    with pytest.raises(ConfigError) as info:
        load_config_data(data, "test")
    text = str(info.value)
    assert "server.wyoming.asr: service 'tts' is a tts service" in text
    assert "server.wyoming.tts: unknown service" in text
    assert "server.wyoming.port: already used by server.port" in text
    ok = base_config()
    ok["server"]["wyoming"] = {"port": 10300}
    assert semantic_problems(load_config_data(ok, "test")) == []


@given(st.lists(st.sampled_from(["a", "b.", "c?", " ", "  ", "d!", "e:"]), max_size=30))
def test_split_sentences_keeps_every_word_in_order(parts: list[str]) -> None:
    text = "".join(parts)
    done, rest = split_sentences(text)
    assert " ".join([*done, rest]).split() == text.split()
    assert all(s and s[-1] in ".!?;:" for s in done)


def test_serve_starts_and_stops_the_wyoming_server(tmp_path: Path) -> None:
    """``accelmux serve -c`` with ``server.wyoming``: it listens, serves, and SIGTERM stops
    it with the daemon (exit status 0, the port free again)."""
    config = base_config()
    port = free_port()
    config["server"]["wyoming"] = {"port": port}

    async def exchange() -> Info:
        async with AsyncTcpClient("127.0.0.1", port) as c:
            await c.write_event(Describe().event())
            info = Info.from_event(await read(c))
            await c.write_event(Synthesize(text="Good night.").event())
            assert (await read_until(c, "audio-stop"))[-1].type == "audio-stop"
            return info

    with daemon(config, tmp_path) as d:
        info = run(exchange())
        assert info.asr and info.tts
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(timeout=20) == 0
        out = d.proc.stdout.read() if d.proc.stdout else ""
    assert f"Wyoming server on tcp://127.0.0.1:{port}" in out and "Traceback" not in out
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # released


def test_zeroconf_is_not_advertised_from_a_loopback_host(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        async with wyoming(tmp=tmp_path, zeroconf=True) as (_, server):
            assert server._zeroconf is None
            assert "loopback" in caplog.text and "not advertised" in caplog.text

    run(body())
    assert advertised_address("192.168.1.20") == "192.168.1.20"


@pytest.mark.parametrize("garbage", [b"not json\n", b'{"no": "type"}\n', b"[1, 2]\n"])
def test_a_malformed_frame_is_answered_and_closes_only_its_connection(
    tmp_path: Path, garbage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        async with wyoming(tmp=tmp_path) as (_, server):
            reader, writer = await asyncio.open_connection(server.cfg.host, server.cfg.port)
            writer.write(garbage)
            await writer.drain()
            answer = await asyncio.wait_for(async_read_event(reader), TIMEOUT)
            assert answer is not None and Error.from_event(answer).code == "malformed_event"
            assert await asyncio.wait_for(reader.read(), TIMEOUT) == b""  # then closed
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            async with client(server) as c:  # the server goes on
                await c.write_event(Describe().event())
                assert Info.is_type((await read(c)).type)
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert "closing the connection" in caplog.text  # one warning line

    run(body())
