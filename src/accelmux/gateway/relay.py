"""How an answer in OpenAI's shape reaches a client that speaks another API.

:func:`accelmux.gateway.openai_api.serve` relays a backend's answer as it is; given a
:class:`Relay` it passes the body, every stream chunk and every error through it first
(the Ollama API turns OpenAI JSON and SSE into its own JSON and NDJSON this way).
"""

from __future__ import annotations

from typing import Protocol

from aiohttp import web

from accelmux.gateway.errors import ApiError


class Relay(Protocol):
    """Per request: rewrites what goes back to the client."""

    #: Content type of a streamed answer.
    stream_content_type: str

    def body(self, status: int, body: bytes) -> bytes:
        """A whole answer (``status`` < 400) in the client's shape."""
        ...

    def chunk(self, data: bytes) -> bytes:
        """Bytes of an OpenAI SSE stream (any split) -> bytes for the client (may be empty)."""
        ...

    def end(self) -> bytes:
        """What the client gets once the stream is over."""
        ...

    def error(self, err: ApiError) -> web.Response:
        """An error before anything was sent."""
        ...

    def stream_error(self, err: ApiError) -> bytes:
        """An error in the middle of a stream."""
        ...
