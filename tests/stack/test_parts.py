"""The stack's parts that need no model: frames, the default budget, camera events."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path

import pytest

from accelmux.cameras.store import EventStore
from accelmux.defaults.stack import host_budget
from accelmux.worker import protocol

GIB = 2**30
MIB = 2**20


def test_frames_round_trip_over_a_socket_pair() -> None:
    files = {"file": b"RIFF" + bytes(range(256)) * 10, "image": b"\xff\xd8jpeg"}
    index, blob = protocol.pack_files(files)
    a, b = socket.socketpair()
    with a, b:
        a.sendall(protocol.encode({"id": 7, "op": "infer", "files": index}, blob))
        a.sendall(protocol.encode({"id": 8, "op": "memory"}))
        header, data = protocol.recv_frame(b)
        assert header["id"] == 7 and protocol.unpack_files(header["files"], data) == files
        assert protocol.recv_frame(b) == ({"id": 8, "op": "memory"}, b"")

    async def read_async() -> tuple[dict[str, object], bytes]:
        r, w = socket.socketpair()
        reader, writer = await asyncio.open_unix_connection(sock=r)
        w.sendall(protocol.encode({"type": "chunk", "id": 1}, b"data: x\n\n"))
        try:
            return await protocol.read_frame(reader)
        finally:
            writer.close()
            w.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    assert asyncio.run(read_async()) == ({"type": "chunk", "id": 1}, b"data: x\n\n")


def test_oversized_or_garbled_frames_are_refused() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(protocol.HEADER.pack(protocol.MAX_HEADER + 1, 0))
        with pytest.raises(protocol.ProtocolError):
            protocol.recv_frame(b)
    a, b = socket.socketpair()
    with a, b:
        a.sendall(protocol.HEADER.pack(3, 0) + b"[1]")
        with pytest.raises(protocol.ProtocolError):
            protocol.recv_frame(b)
        a.close()
        with pytest.raises(EOFError):
            protocol.recv_frame(b)


@pytest.mark.parametrize(
    ("ram_gib", "budget_gib", "headroom_mib"),
    [(2, 1.0, 256), (4, 1.5, 256), (16, 5.25, 672), (24, 8.0, 1024), (128, 8.0, 1024)],
)
def test_default_budget_follows_the_ram(ram_gib: int, budget_gib: float, headroom_mib: int) -> None:
    budget, headroom = host_budget(ram_gib * GIB)
    assert budget == pytest.approx(budget_gib * GIB, abs=256 * MIB)
    assert budget % (256 * MIB) == 0 and budget <= 0.6 * ram_gib * GIB
    assert headroom == pytest.approx(headroom_mib * MIB, abs=33 * MIB)
    assert headroom < budget


def test_camera_events_are_stored_and_queried(tmp_path: Path) -> None:
    store = EventStore.open(tmp_path / "events.sqlite")
    try:
        face = {"label": "face", "score": 0.9, "box": [1, 2, 3, 4]}
        person = {"label": "person", "score": 0.6, "box": [0, 0, 9, 9]}
        assert store.record("porch", 100.0, {"frame": 1, "timestamp_s": 0.5, "detections": []}) == 0
        assert store.record("porch", 101.0, {"frame": 2, "detections": [face, person]}) == 2
        assert store.record("garage", 102.0, {"frame": 1, "detections": [person]}) == 1
        events = store.events("porch")
        assert [(e["label"], e["frame"], e["box"]) for e in events] == [
            ("face", 2, [1, 2, 3, 4]),
            ("person", 2, [0, 0, 9, 9]),
        ]
        assert [e["label"] for e in store.events("porch", label="person")] == ["person"]
        assert store.events("porch", after_id=events[-1]["id"]) == []
        assert store.events("porch", since=101.5) == []
        assert store.count("garage") == 1
    finally:
        store.close()
