"""What the cluster gateway reads of a request to route it: its model, and whether its
answer streams. The body itself is forwarded untouched to the node that serves it, whose
own gateway validates it as on a single machine."""

from __future__ import annotations

import json
from email.parser import BytesParser
from email.policy import HTTP

#: Ollama streams these unless the body says ``"stream": false``.
OLLAMA_STREAMING = ("/api/chat", "/api/generate")


def parse_json(body: bytes) -> object:
    """The JSON body, or None when it is not JSON (the node answers the 400)."""
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None


def model_of(content_type: str, body: bytes) -> str | None:
    """The ``model`` a request names: a JSON field, or a multipart form field (audio
    transcriptions); None when there is none."""
    if content_type.startswith("multipart/"):
        return _multipart_field(content_type, body, "model")
    data = parse_json(body)
    if isinstance(data, dict):
        model = data.get("model")
        if isinstance(model, str) and model:
            return model
    return None


def _multipart_field(content_type: str, body: bytes, name: str) -> str | None:
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = BytesParser(policy=HTTP).parsebytes(head + body)
    if not message.is_multipart():
        return None
    for part in message.iter_parts():
        if part.get_param("name", header="content-disposition") == name:
            payload = part.get_payload(decode=True)
            if isinstance(payload, bytes):
                return payload.decode("utf-8", "replace").strip() or None
    return None


def streams(path: str, content_type: str, body: bytes) -> bool:
    """Whether the answer comes as a stream (SSE or NDJSON), so the gateway relays it
    chunk by chunk instead of as one answer."""
    if content_type.startswith("multipart/"):
        return False
    data = parse_json(body)
    if not isinstance(data, dict):
        return False
    stream = data.get("stream")
    if path in OLLAMA_STREAMING:
        return stream is not False
    return stream is True


def job_model(content_type: str, query_model: str | None, body: bytes) -> str | None:
    """The model a job submission names: ``?model=`` (JSON lines), else its JSON body's
    ``model``, else the first JSON line's."""
    if query_model:
        return query_model
    found = model_of(content_type, body)
    if found is not None:
        return found
    first = body.lstrip().split(b"\n", 1)[0]
    return model_of("application/json", first) if first else None
