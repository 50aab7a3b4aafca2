"""The wire format between the daemon and its inference worker.

One frame = ``u32 header length`` + ``u32 blob length`` (big-endian) + the header (UTF-8
JSON object) + the blob (raw bytes: audio, images, response bodies, stream chunks).
Binary payloads never go through JSON.

Requests (daemon -> worker) carry ``id`` (unique per connection) and ``op``:

=========  ==================================================================
op         header fields (blob)
=========  ==================================================================
load       service, kind, options, model_path, kv_pool_bytes, gpu_index, device
unload     service, tier (``cold`` or ``parked``), end_paused (its paused requests end)
resize     service, kv_pool_bytes
infer      service, endpoint, body, stream, files (name -> [offset, length]),
           request_id (the daemon's), paused (start paused: a pause came first) (blob)
pause      service, request_id, park
resume     service, request_id
cancel     target (the id of a running infer)
memory     -
=========  ==================================================================

Replies (worker -> daemon) carry the request's ``id`` and ``type``: ``ok`` (the result
fields), ``error`` (``error``, ``error_type``: ``request`` / ``backend``, ``status``,
``field``), and for a streamed infer any number of ``chunk`` frames (blob) before the
final ``ok``. A pause is answered once it took (``state``: ``paused``, with
``parked_bytes`` and ``seconds``; ``ended`` when the request had ended), a resume once
the request is queued to continue (``state``: ``resuming``, or ``running`` / ``ended``
when there was nothing to resume); a request the worker never saw is an ``error``, and
so is a resume of a request whose service is not loaded (it stays paused). Paused
requests outlive an unload; the ``memory`` reply gives those of services not loaded
(``parked_streams``: per service, ``paused`` and ``parked_kv`` bytes;
``parked_streams_bytes``: in all). The worker sends ``hello`` (pid) once when it is
ready.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from typing import Any

HEADER = struct.Struct(">II")
#: Largest header accepted (JSON bodies of requests; embeddings inputs can be large).
MAX_HEADER = 64 * 2**20
#: Largest blob accepted (uploaded files, response bodies).
MAX_BLOB = 256 * 2**20

Message = dict[str, Any]


class ProtocolError(Exception):
    """The peer sent something that is not a frame."""


def encode(header: Message, blob: bytes = b"") -> bytes:
    head = json.dumps(header, separators=(",", ":")).encode()
    return HEADER.pack(len(head), len(blob)) + head + blob


def _check(head_len: int, blob_len: int) -> None:
    if head_len > MAX_HEADER or blob_len > MAX_BLOB:
        raise ProtocolError(f"frame too large ({head_len} + {blob_len} bytes)")


def _decode_header(raw: bytes) -> Message:
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise ProtocolError(f"bad frame header: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError("frame header is not an object")
    return header


async def read_frame(reader: asyncio.StreamReader) -> tuple[Message, bytes]:
    """Read one frame; raises IncompleteReadError at end of stream."""
    head_len, blob_len = HEADER.unpack(await reader.readexactly(HEADER.size))
    _check(head_len, blob_len)
    header = _decode_header(await reader.readexactly(head_len))
    blob = await reader.readexactly(blob_len) if blob_len else b""
    return header, blob


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("connection closed")
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket) -> tuple[Message, bytes]:
    """Blocking read of one frame (the worker's side); EOFError when the peer is gone."""
    head_len, blob_len = HEADER.unpack(_recv_exactly(sock, HEADER.size))
    _check(head_len, blob_len)
    header = _decode_header(_recv_exactly(sock, head_len))
    blob = _recv_exactly(sock, blob_len) if blob_len else b""
    return header, blob


def pack_files(files: dict[str, bytes]) -> tuple[dict[str, list[int]], bytes]:
    """Concatenate files into one blob; the index maps name -> [offset, length]."""
    index: dict[str, list[int]] = {}
    parts: list[bytes] = []
    offset = 0
    for name, data in files.items():
        index[name] = [offset, len(data)]
        parts.append(data)
        offset += len(data)
    return index, b"".join(parts)


def unpack_files(index: Any, blob: bytes) -> dict[str, bytes]:
    if not isinstance(index, dict):
        return {}
    out: dict[str, bytes] = {}
    for name, span in index.items():
        offset, length = int(span[0]), int(span[1])
        out[str(name)] = blob[offset : offset + length]
    return out
