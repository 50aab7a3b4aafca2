"""Reading one Wyoming event from a client that may be hostile.

A Wyoming event is a JSON header line, then ``data_length`` bytes of JSON data, then
``payload_length`` bytes of payload. The ``wyoming`` package's reader
(``wyoming.event.async_read_event``) trusts the lengths: it reads whatever a client
declares (``readexactly`` of a 3 GB ``payload_length`` buffers all that arrives), has no
timeout, and turns a header that is not an object, or a ``type`` that is not a string,
into an exception or a silent close. This reader keeps the package's framing and its
:class:`~wyoming.event.Event` and adds what a server open to a network needs:

* the header line is read up to ``max_header_bytes`` (the stream's limit);
* the header must be a JSON object with a string ``type``, an object ``data`` (if any)
  and non-negative integer lengths;
* ``data_length`` and ``payload_length`` are checked against their caps *before*
  anything is read or allocated;
* once the first byte of an event has arrived, the whole event must arrive within
  ``event_timeout_s``; before that, the connection may be silent ``idle_timeout_s``.

Every violation is a :class:`FrameError`: the server answers it with an ``error`` event
and closes the connection (the stream cannot be resynchronised after a bad frame).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from wyoming.error import Error
from wyoming.event import Event

from accelmux.config.wyoming import WyomingConfig
from accelmux.errors import AccelmuxError

_KEY = "server.wyoming."


class WyomingError(AccelmuxError):
    """A failure answered with a Wyoming ``error`` event (the connection stays open)."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text

    def event(self) -> Event:
        return Error(text=self.text, code=self.code).event()


class FrameError(WyomingError):
    """The client broke the framing or a limit: answered, then the connection closes."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FrameLimits:
    """What one event may be (from ``server.wyoming``)."""

    max_header_bytes: int
    max_data_bytes: int
    max_payload_bytes: int
    idle_timeout_s: float
    event_timeout_s: float

    @classmethod
    def of(cls, wy: WyomingConfig) -> FrameLimits:
        return cls(
            max_header_bytes=int(wy.max_header_bytes),
            max_data_bytes=int(wy.max_data_bytes),
            max_payload_bytes=int(wy.max_payload_bytes),
            idle_timeout_s=wy.idle_timeout_s,
            event_timeout_s=wy.event_timeout_s,
        )


async def read_event(reader: asyncio.StreamReader, limits: FrameLimits) -> Event | None:
    """The next event, or None when the client closed the connection between events.

    ``reader`` must have been made with ``limit=limits.max_header_bytes`` (its
    ``readuntil`` refuses a longer line without buffering more than about twice that).
    """
    loop = asyncio.get_running_loop()
    started = False
    try:
        async with asyncio.timeout(limits.idle_timeout_s) as deadline:
            first = await reader.read(1)
            if not first:
                return None
            started = True
            deadline.reschedule(loop.time() + limits.event_timeout_s)
            return await _rest_of_event(first, reader, limits)
    except TimeoutError:
        if started:
            raise FrameError(
                "event_timeout",
                f"an event started but did not arrive whole within "
                f"{limits.event_timeout_s:g} s ({_KEY}event_timeout_s): closing",
            ) from None
        raise FrameError(
            "idle_timeout",
            f"no event for {limits.idle_timeout_s:g} s ({_KEY}idle_timeout_s): closing",
        ) from None
    except asyncio.IncompleteReadError:
        return None  # the client closed in the middle of an event


async def _rest_of_event(
    first: bytes, reader: asyncio.StreamReader, limits: FrameLimits
) -> Event | None:
    line = first
    if first != b"\n":
        try:
            line += await reader.readuntil(b"\n")
        except asyncio.LimitOverrunError:
            raise FrameError(
                "event_too_large",
                f"the header line is longer than {limits.max_header_bytes} bytes "
                f"({_KEY}max_header_bytes)",
            ) from None
    header = _header(line)
    data_length = _length(header, "data_length", limits.max_data_bytes, "max_data_bytes")
    payload_length = _length(
        header, "payload_length", limits.max_payload_bytes, "max_payload_bytes"
    )
    data = header.get("data")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise FrameError("malformed_event", f"'data' must be a JSON object (got {json_kind(data)})")
    if data_length:
        extra = _json(await reader.readexactly(data_length), "the data section")
        if not isinstance(extra, dict):
            raise FrameError(
                "malformed_event",
                f"the data section must be a JSON object (got {json_kind(extra)})",
            )
        data.update(extra)
    payload = await reader.readexactly(payload_length) if payload_length else None
    return Event(type=header["type"], data=data, payload=payload)


def _header(line: bytes) -> dict[str, Any]:
    header = _json(line, "the header line")
    if not isinstance(header, dict):
        raise FrameError(
            "malformed_event", f"the header must be a JSON object (got {json_kind(header)})"
        )
    kind = header.get("type")
    if not isinstance(kind, str) or not kind:
        raise FrameError(
            "malformed_event", f"the header needs a string 'type' (got {json_kind(kind)})"
        )
    return header


def _json(raw: bytes, what: str) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        reason = "nested too deep" if isinstance(exc, RecursionError) else str(exc)
        raise FrameError("malformed_event", f"{what} is not JSON: {reason}") from None


def _length(header: dict[str, Any], name: str, cap: int, key: str) -> int:
    value = header.get(name)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FrameError(
            "malformed_event", f"'{name}' must be a non-negative integer (got {value!r:.40})"
        )
    if value > cap:
        raise FrameError(
            "event_too_large",
            f"'{name}' {value} is above {cap} bytes ({_KEY}{key}): refused unread",
        )
    return value


def json_kind(value: Any) -> str:
    """What a JSON value is, for an error text."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"
