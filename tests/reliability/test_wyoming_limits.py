"""Hostile Wyoming clients against the server: sizes declared before anything is read,
the length of one utterance and one text, malformed headers and fields, silent and
stalled connections, a flood of connections over the cap, and a network listener
nobody asked for. Hostile cases speak raw sockets; the normal path is the ``wyoming``
package's own client, as Home Assistant speaks it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import resource
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from tests.live.support import base_config, free_port, run, settle
from tests.live.test_wyoming import client, read, read_until, tone, wyoming
from tests.reliability.conftest import Record
from tests.reliability.support import running, write_config
from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event, async_read_event, async_write_event
from wyoming.info import Describe, Info
from wyoming.ping import Ping, Pong
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop

from accelmux.config.wyoming import WyomingConfig
from accelmux.gateway.wyoming_frames import FrameError, FrameLimits, read_event

TIMEOUT = 10.0
MiB = 1024**2


def _line(header: dict[str, Any]) -> bytes:
    return json.dumps(header).encode() + b"\n"


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def _answer_then_eof(reader: asyncio.StreamReader) -> Event:
    """The one event the server answers with, then the end of the connection."""
    event = await asyncio.wait_for(async_read_event(reader), TIMEOUT)
    assert event is not None, "closed without an answer"
    try:
        rest = await asyncio.wait_for(reader.read(), TIMEOUT)
    except ConnectionResetError:  # closed with unread bytes of ours: a reset, not a FIN
        rest = b""
    assert rest == b"", f"more after the error: {rest[:200]!r}"
    return event


async def _send(writer: asyncio.StreamWriter, frame: bytes) -> None:
    """Write ``frame``; the server may close before it has read it all."""
    writer.write(frame)
    with contextlib.suppress(ConnectionError):
        await writer.drain()


def _close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        writer.close()


def _no_errors_logged(caplog: pytest.LogCaptureFixture) -> None:
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [r.getMessage() for r in bad]


# ---- sizes declared before anything is read -------------------------------------------------
def test_declared_sizes_above_the_caps_are_refused_before_reading(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, record: Record
) -> None:
    """A ``payload_length`` of 3 GB, a ``data_length`` above the cap and a header line
    longer than allowed: each is an ``error`` event naming its config key, then close."""
    cases = {
        "payload_length": (
            _line({"type": "audio-chunk", "payload_length": 3_000_000_000}),
            "max_payload_bytes",
        ),
        "data_length": (
            _line({"type": "synthesize", "data_length": 50 * MiB}),
            "max_data_bytes",
        ),
        "header line": (b'{"type": "describe", "pad": "' + b"x" * (200 * 1024), "max_header_bytes"),
    }

    async def body() -> dict[str, str]:
        seen = {}
        async with wyoming(tmp=tmp_path) as (_, server):
            for name, (frame, key) in cases.items():
                reader, writer = await _connect(server.cfg.port)
                try:
                    await _send(writer, frame)
                    err = Error.from_event(await _answer_then_eof(reader))
                finally:
                    _close(writer)
                assert err.code == "event_too_large", (name, err)
                assert f"server.wyoming.{key}" in (err.text or ""), (name, err.text)
                seen[name] = err.text or ""
            async with client(server) as c:  # the server goes on
                await c.write_event(Describe().event())
                assert Info.is_type((await read(c)).type)
        return seen

    seen = run(body())
    _no_errors_logged(caplog)
    record(
        area="wyoming",
        case="declared payload_length 3 GB, data_length 50 MiB, a 200 KiB header line",
        expected="an error event naming the limit before anything is read, then close",
        happened="; ".join(seen.values()),
    )


def _rss(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


@pytest.mark.slow
def test_a_declared_3gb_payload_with_200mib_sent_leaves_the_daemon_rss_flat(
    tmp_path: Path, record: Record
) -> None:
    port = free_port()
    config = base_config()
    config["server"]["wyoming"] = {"port": port}
    sent = 0
    with running(write_config(config, tmp_path)) as proc:
        pid = proc.popen.pid
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as warm:
            warm.sendall(_line({"type": "describe"}))
            warm.recv(65536)
        before = _rss(pid)
        header = _line({"type": "audio-chunk", "payload_length": 3_000_000_000})
        block = b"\0" * MiB
        connections = 0
        while sent < 200 * MiB and connections < 400:  # the declared payload, as it goes in
            connections += 1
            with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
                sock.sendall(header)
                with contextlib.suppress(OSError):
                    while sent < 200 * MiB:
                        sent += sock.send(block)
        grown = _rss(pid) - before
        assert proc.alive()
    assert grown < 32 * MiB, f"RSS grew by {grown / MiB:.1f} MiB after {sent / MiB:.0f} MiB sent"
    record(
        area="wyoming",
        case="payload_length 3 GB declared, then up to 200 MiB sent",
        expected="refused at the header; the daemon's RSS does not grow",
        happened=f"each connection refused at its header: {sent / MiB:.0f} MiB pushed over "
        f"{connections} connection(s) before each reset; RSS grew {grown / MiB:+.1f} MiB",
        rss_growth_mib=round(grown / MiB, 1),
        sent_mib=round(sent / MiB),
        connections=connections,
    )


# ---- the length of one utterance and one text ------------------------------------------------
def test_an_utterance_above_max_utterance_s_is_an_error_and_the_connection_stays(
    tmp_path: Path, record: Record
) -> None:
    async def body() -> str:
        async with wyoming(tmp=tmp_path, max_utterance_s=1.0) as (_, server):
            async with client(server) as c:  # just under the cap: transcribed
                await c.write_event(Transcribe(language="en").event())
                pcm = tone(0.9, 16000)
                await c.write_event(AudioStart(rate=16000, width=2, channels=1).event())
                for i in range(0, len(pcm), 2048):
                    chunk = AudioChunk(rate=16000, width=2, channels=1, audio=pcm[i : i + 2048])
                    await c.write_event(chunk.event())
                await c.write_event(AudioStop().event())
                assert Transcript.is_type((await read(c)).type)
            async with client(server) as c:  # over it, in 16 kHz 16-bit mono chunks
                await c.write_event(Transcribe(language="en").event())
                pcm = tone(3.0, 16000)
                await c.write_event(AudioStart(rate=16000, width=2, channels=1).event())
                for i in range(0, len(pcm), 2048):
                    chunk = AudioChunk(rate=16000, width=2, channels=1, audio=pcm[i : i + 2048])
                    await c.write_event(chunk.event())
                await c.write_event(AudioStop().event())
                err = Error.from_event(await read(c))
                assert err.code == "audio_too_long", err
                assert "server.wyoming.max_utterance_s" in (err.text or "")
                await c.write_event(Ping(text="still there").event())
                assert Pong.from_event(await read(c)).text == "still there"
                return err.text or ""

    text = run(body())
    record(
        area="wyoming",
        case="an utterance of 3 s against max_utterance_s 1",
        expected="one error event naming the limit; the connection is served on",
        happened=text,
    )


def test_a_text_above_max_text_chars_is_an_error_plain_and_streamed(tmp_path: Path) -> None:
    async def body() -> None:
        async with wyoming(tmp=tmp_path, max_text_chars=100) as (_, server):
            async with client(server) as c:
                await c.write_event(Synthesize(text="Hello. " * 40).event())
                err = Error.from_event(await read(c))
                assert err.code == "text_too_long", err
                assert "server.wyoming.max_text_chars" in (err.text or "")
                await c.write_event(Synthesize(text="Short one.").event())
                assert (await read_until(c, "audio-stop"))[-1].type == "audio-stop"
            async with client(server) as c:  # a stream may not outgrow it either
                await c.write_event(SynthesizeStart().event())
                for _ in range(30):
                    await c.write_event(SynthesizeChunk(text="word ").event())
                await c.write_event(SynthesizeStop().event())
                events = await read_until(c, "synthesize-stopped")
                codes = [Error.from_event(e).code for e in events if Error.is_type(e.type)]
                assert codes == ["text_too_long"], events

    run(body())


# ---- malformed headers and fields -------------------------------------------------------------
def test_synthesize_without_a_string_text_is_an_error_event_without_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, record: Record
) -> None:
    bad = [
        Event(type="synthesize", data={}),
        Event(type="synthesize", data={"text": 123}),
        Event(type="synthesize", data={"text": None}),
        Event(type="synthesize", data={"text": "hi", "voice": "not an object"}),
        Event(type="synthesize", data={"text": "hi", "voice": {"name": 5}}),
        Event(type="synthesize-start", data={"voice": [1]}),
        Event(type="audio-chunk", data={"width": 2, "channels": 1}, payload=b"\0\0"),
        Event(type="audio-start", data={"rate": "fast", "width": 2, "channels": 1}),
        Event(type="transcribe", data={"language": ["en"]}),
    ]

    async def body() -> list[str]:
        texts = []
        async with wyoming(tmp=tmp_path) as (_, server), client(server) as c:
            for event in bad:
                await c.write_event(event)
                err = Error.from_event(await read(c))
                assert err.code == "invalid_value", (event, err)
                assert event.type in (err.text or ""), (event, err)
                texts.append(err.text or "")
            await c.write_event(SynthesizeStart().event())  # a stream, then a bad chunk
            await c.write_event(Event(type="synthesize-chunk", data={"text": 7}))
            assert Error.from_event(await read(c)).code == "invalid_value"
            await c.write_event(Ping(text="still there").event())
            assert Pong.from_event(await read(c)).text == "still there"
        return texts

    texts = run(body())
    _no_errors_logged(caplog)
    assert "internal_error" not in caplog.text
    record(
        area="wyoming",
        case="synthesize without text, with a number or null as text, bad voice, audio "
        "without rate, and like",
        expected="an invalid_value error event naming the field; no traceback; served on",
        happened=texts[0],
    )


@pytest.mark.parametrize(
    "frame",
    [
        b'{"type": 5}\n',
        b'{"type": null, "data": {}}\n',
        b'{"no": "type"}\n',
        b"[1, 2]\n",
        b"not json\n",
        b'{"type": "describe", "data": [1]}\n',
        b'{"type": "describe", "data_length": "5"}\n',
        b'{"type": "describe", "payload_length": -1}\n',
        b'{"type": "describe", "data_length": 4}\n[12]',
        b"[" * 50_000 + b"\n",
    ],
    ids=[
        "type-number",
        "type-null",
        "no-type",
        "array",
        "not-json",
        "data-array",
        "length-string",
        "length-negative",
        "data-not-object",
        "deep",
    ],
)
def test_a_malformed_header_gets_an_error_event_and_the_connection_closes(
    tmp_path: Path, frame: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        async with wyoming(tmp=tmp_path) as (_, server):
            reader, writer = await _connect(server.cfg.port)
            try:
                await _send(writer, frame)
                err = Error.from_event(await _answer_then_eof(reader))
            finally:
                _close(writer)
            assert err.code == "malformed_event", err
            async with client(server) as c:
                await c.write_event(Describe().event())
                assert Info.is_type((await read(c)).type)

    run(body())
    _no_errors_logged(caplog)


# ---- silent and stalled connections; the connection cap --------------------------------------
def test_an_event_that_starts_and_stalls_is_closed_after_event_timeout_s(
    tmp_path: Path, record: Record
) -> None:
    stalls = {
        "half a header line": b'{"type": "desc',
        "a payload cut short": _line({"type": "audio-chunk", "payload_length": 100}) + b"x" * 10,
    }

    async def body() -> str:
        text = ""
        async with wyoming(tmp=tmp_path, event_timeout_s=0.5, idle_timeout_s=60) as (_, server):
            for frame in stalls.values():
                reader, writer = await _connect(server.cfg.port)
                try:
                    await _send(writer, frame)
                    err = Error.from_event(await _answer_then_eof(reader))
                finally:
                    _close(writer)
                assert err.code == "event_timeout", err
                assert "server.wyoming.event_timeout_s" in (err.text or "")
                text = err.text or ""
        return text

    text = run(body())
    record(
        area="wyoming",
        case="half a header line; a payload cut short (event_timeout_s 0.5)",
        expected="an error event naming the limit, then close",
        happened=text,
    )


def _fd_room() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft - len(os.listdir("/proc/self/fd"))


@pytest.mark.slow
def test_idle_connections_are_closed_and_the_cap_answers_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, record: Record
) -> None:
    """Hundreds of silent sockets: the first ``max_connections`` are closed after the idle
    timeout with an ``idle_timeout`` event, the rest at once with ``too_many_connections``;
    the real client is answered while the cap is full and right after."""
    count = min(1000, (_fd_room() - 100) // 2)  # both ends of each socket live here
    assert count >= 300, f"fd limit too low for this test ({count})"
    cap = 50
    wy = {"max_connections": cap, "idle_timeout_s": 5.0}

    async def body() -> dict[str, Any]:
        async with wyoming(tmp=tmp_path, **wy) as (_, server):
            conns = [await _connect(server.cfg.port) for _ in range(cap)]
            try:
                await settle(lambda: len(server.connections) == cap)
                # the cap is full: a describe is answered at once, with the reason
                async with client(server) as c:
                    await c.write_event(Describe().event())
                    full = await read(c)
                conns += [await _connect(server.cfg.port) for _ in range(count - cap)]
                answers = await asyncio.gather(*(_answer_then_eof(r) for r, _ in conns))
            finally:
                for _, w in conns:
                    _close(w)
            codes: dict[str, int] = {}
            for event in answers:
                code = Error.from_event(event).code or ""
                codes[code] = codes.get(code, 0) + 1
            await settle(lambda: not server.connections)
            # right after: served again
            async with client(server) as c:
                await c.write_event(Describe().event())
                after = await read(c)
            return {"codes": codes, "full": full, "after": after}

    out = run(body())
    codes, full, after = out["codes"], out["full"], out["after"]
    assert Error.is_type(full.type) and Error.from_event(full).code == "too_many_connections"
    assert "server.wyoming.max_connections" in (Error.from_event(full).text or "")
    assert Info.is_type(after.type)
    # the flood is refused at once; only a flood slower than the idle timeout wins a slot
    assert set(codes) == {"idle_timeout", "too_many_connections"}, codes
    assert sum(codes.values()) == count and codes["idle_timeout"] >= cap, codes
    _no_errors_logged(caplog)
    record(
        area="wyoming",
        case=f"{count} silent connections (max_connections {cap}, idle_timeout_s 5)",
        expected="every one closed with an error event; describe answered while full and after",
        happened=f"{codes}; describe while full: too_many_connections, after: info",
    )


def test_a_home_assistant_exchange_within_the_limits(tmp_path: Path) -> None:
    """describe, then a transcription of 16 kHz chunks, then a synthesis, each on a
    connection of its own, as Home Assistant does it, with tight limits set."""
    wy = {"idle_timeout_s": 5.0, "event_timeout_s": 5.0, "max_connections": 3}

    async def body() -> None:
        async with wyoming(tmp=tmp_path, **wy) as (_, server):
            for _ in range(3):
                async with client(server) as c:
                    await c.write_event(Describe().event())
                    assert Info.is_type((await read(c)).type)
                async with client(server) as c:
                    await c.write_event(Transcribe(language="en").event())
                    pcm = tone(1.0, 16000)
                    await c.write_event(AudioStart(rate=16000, width=2, channels=1).event())
                    for i in range(0, len(pcm), 2048):
                        audio = pcm[i : i + 2048]
                        await c.write_event(
                            AudioChunk(rate=16000, width=2, channels=1, audio=audio).event()
                        )
                    await c.write_event(AudioStop().event())
                    assert Transcript.is_type((await read(c)).type)
                async with AsyncTcpClient(server.cfg.host, server.cfg.port) as c:
                    await c.write_event(Synthesize(text="Good night.").event())
                    assert (await read_until(c, "audio-stop"))[-1].type == "audio-stop"

    run(body())


# ---- a network listener nobody asked for ------------------------------------------------------
def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "accelmux.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _network_config(tmp_path: Path, name: str, **wy: Any) -> Path:
    config = base_config()
    config["server"]["wyoming"] = {"host": "0.0.0.0", "port": free_port(), **wy}
    config["server"]["data_dir"] = str(tmp_path / "data")
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.slow
def test_wyoming_off_loopback_needs_an_explicit_opt_in(tmp_path: Path, record: Record) -> None:
    path = _network_config(tmp_path, "open.yaml")
    out = _cli("serve", "-c", str(path), "--port", str(free_port()))
    assert out.returncode != 0, (out.stdout, out.stderr)
    line = out.stderr.strip().splitlines()[-1]
    assert "server.wyoming.allow_network" in line and "0.0.0.0" in line, out.stderr
    assert "Traceback" not in out.stderr and "listening" not in out.stdout, out
    checked = _cli("check", str(path))
    assert checked.returncode == 2, (checked.stdout, checked.stderr)
    assert "server.wyoming.host" in checked.stderr
    assert "allow_network" in checked.stderr, checked.stderr
    # the opt-in lets it start, and check passes
    allowed = _network_config(tmp_path, "allowed.yaml", allow_network=True)
    assert _cli("check", str(allowed)).returncode == 0
    config = yaml.safe_load(allowed.read_text())
    port = config["server"]["wyoming"]["port"]
    with running(write_config(config, tmp_path, name="allowed-run.yaml")):

        async def describe() -> Event:
            async with AsyncTcpClient("127.0.0.1", port) as c:
                await c.write_event(Describe().event())
                return await read(c)

        assert Info.is_type(run(describe()).type)
    record(
        area="security",
        case="server.wyoming.host 0.0.0.0 without server.wyoming.allow_network",
        expected="serve refuses with one line; check reports it; the opt-in starts it",
        happened=f"exit {out.returncode}: {line!r}",
    )


def test_the_limits_have_defaults_that_fit_home_assistant() -> None:
    cfg = WyomingConfig()
    assert cfg.allow_network is False
    assert cfg.max_payload_bytes >= 64 * 1024  # a few seconds of 16 kHz audio in one chunk
    assert cfg.max_utterance_s >= 60
    assert cfg.max_text_chars >= 2000
    assert cfg.idle_timeout_s >= 10 and cfg.event_timeout_s >= 5
    assert cfg.max_connections >= 8
    # the sizes Home Assistant sends fit under the defaults: 1024 samples of 16-bit mono
    chunk = AudioChunk(rate=16000, width=2, channels=1, audio=b"\0" * 2048).event()
    assert len(chunk.payload or b"") <= cfg.max_payload_bytes


# ---- the reader itself ------------------------------------------------------------------------
SMALL = FrameLimits(
    max_header_bytes=256,
    max_data_bytes=64,
    max_payload_bytes=64,
    idle_timeout_s=5.0,
    event_timeout_s=5.0,
)


async def _read_all(raw: bytes, limits: FrameLimits = SMALL) -> list[Event | FrameError]:
    reader = asyncio.StreamReader(limit=limits.max_header_bytes)
    reader.feed_data(raw)
    reader.feed_eof()
    out: list[Event | FrameError] = []
    while True:
        try:
            event = await read_event(reader, limits)
        except FrameError as exc:
            out.append(exc)
            return out
        if event is None:
            return out
        out.append(event)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
)


def _frames() -> st.SearchStrategy[bytes]:
    """Bytes, JSON lines of any value, and headers with any type, data and lengths."""
    header = st.fixed_dictionaries(
        {},
        optional={
            "type": json_values,
            "data": json_values,
            "data_length": st.integers(-2, 100) | json_values,
            "payload_length": st.integers(-2, 100) | json_values,
        },
    )
    line = (json_values | header).map(lambda v: json.dumps(v).encode() + b"\n")
    return st.lists(line | st.binary(max_size=80), max_size=6).map(b"".join)


@given(_frames())
def test_any_bytes_are_events_or_one_frame_error_never_an_exception(raw: bytes) -> None:
    for item in asyncio.run(_read_all(raw)):
        if isinstance(item, Event):
            assert isinstance(item.type, str) and isinstance(item.data, dict)
            assert len(item.payload or b"") <= SMALL.max_payload_bytes
        else:
            assert item.code in {"malformed_event", "event_too_large"}, item


@given(
    st.text(min_size=1, max_size=20),
    st.dictionaries(st.text(max_size=8), json_values, max_size=4),
    st.binary(max_size=40),
)
def test_what_the_package_writes_reads_back_the_same(
    kind: str, data: dict[str, Any], payload: bytes
) -> None:
    async def body() -> list[Event | FrameError]:
        reader = asyncio.StreamReader(limit=4096)
        out = _Sink()
        await async_write_event(Event(type=kind, data=data, payload=payload), out)  # type: ignore[arg-type]
        reader.feed_data(out.buffer)
        reader.feed_eof()
        limits = FrameLimits(
            max_header_bytes=4096,
            max_data_bytes=4096,
            max_payload_bytes=4096,
            idle_timeout_s=5.0,
            event_timeout_s=5.0,
        )
        event = await read_event(reader, limits)
        assert await read_event(reader, limits) is None
        return [] if event is None else [event]

    (event,) = asyncio.run(body())
    assert isinstance(event, Event)
    assert (event.type, event.data, event.payload) == (kind, data, payload or None)


class _Sink:
    """A StreamWriter stand-in that keeps what is written."""

    def __init__(self) -> None:
        self.buffer = b""

    def write(self, data: bytes) -> None:
        self.buffer += data

    def writelines(self, lines: list[bytes]) -> None:
        self.buffer += b"".join(lines)

    async def drain(self) -> None:
        return None
