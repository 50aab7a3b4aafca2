"""The ``server.limits:`` section: how much one request may hold, route by route.

Every limit is checked before the work that grows with it: a body's size against its
route's limit before it is read (its Content-Length) and while it is read (a chunked
body stops at the limit); the number of messages, tools, content parts and embedding
inputs right after the JSON is parsed, before the request models validate it and
before its tokens are counted. A body larger than ``offload_body`` is parsed, checked
and counted in a worker thread, so that the event loop keeps serving other requests
meanwhile; one larger than ``preflight_body`` is first parsed and counted in a process
of its own (a parse holds its interpreter's lock throughout, and a body over the limits
is then refused without the daemon ever parsing it). ``server.max_body`` stays the
ceiling of every route (uploads use it).
"""

from __future__ import annotations

from pydantic import BaseModel, ByteSize, ConfigDict, Field

MIB = 1024**2
#: OpenAI's own ceiling on the inputs of one embeddings request (the request model's).
MAX_EMBEDDING_INPUTS = 2048


class LimitsConfig(BaseModel):
    """Per-route body sizes and item counts; beyond one, 413 (size) or 400 (count)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    chat_body: ByteSize = Field(
        ByteSize(8 * MIB),
        gt=0,
        description="Largest body of /v1/chat/completions, /v1/completions, /api/chat and "
        "/api/generate (413 body_too_large beyond it; server.max_body caps it).",
    )
    embeddings_body: ByteSize = Field(
        ByteSize(8 * MIB),
        gt=0,
        description="Largest body of /v1/embeddings, /api/embed and /api/embeddings.",
    )
    small_body: ByteSize = Field(
        ByteSize(1 * MIB),
        gt=0,
        description="Largest body of /v1/audio/speech, /v1/images/generations and "
        "/api/show. Uploads (/v1/audio/transcriptions, /v1/detections) take server.max_body.",
    )
    messages: int = Field(
        2048, ge=1, le=1_000_000, description="Most messages in one chat request (400 beyond)."
    )
    tools: int = Field(128, ge=1, le=100_000, description="Most tools in one chat request.")
    content_parts: int = Field(
        64, ge=1, le=100_000, description="Most content parts in one message."
    )
    embedding_inputs: int = Field(
        MAX_EMBEDDING_INPUTS,
        ge=1,
        le=MAX_EMBEDDING_INPUTS,
        description="Most inputs (texts or token arrays) in one embeddings request.",
    )
    offload_body: ByteSize = Field(
        ByteSize(256 * 1024),
        ge=0,
        description="Bodies larger than this are parsed, validated and counted in a worker "
        "thread, off the event loop (0: always).",
    )
    preflight_body: ByteSize = Field(
        ByteSize(1 * MIB),
        ge=0,
        description="Bodies larger than this are first parsed and counted in a separate "
        "process, so that one over the limits is refused without the daemon parsing it.",
    )
