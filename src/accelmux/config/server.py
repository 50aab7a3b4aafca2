"""The ``server:`` section: where the daemon listens and how it guards the door."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ByteSize, ConfigDict, Field

from accelmux.config.limits import LimitsConfig
from accelmux.config.wyoming import WyomingConfig


class RateLimitConfig(BaseModel):
    """A token bucket per API key (per client address when no keys are configured)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_s: float = Field(gt=0, le=1_000_000, description="Sustained request rate.")
    burst: int = Field(ge=1, le=1_000_000, description="Requests allowed at once (bucket size).")


class ServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field("127.0.0.1", description="Listen address (loopback by default).")
    port: int = Field(8600, ge=1, le=65535)
    api_keys: list[str] = Field(default_factory=list, description="Bearer keys for /v1 and /api.")
    admin_key: str | None = Field(None, description="Bearer key for /admin and the dashboard.")
    allow_unauthenticated: bool = Field(
        False,
        description="Serve /v1 without api_keys on a non-loopback host (open to the network); "
        "without it serve refuses to start there (serve --allow-open sets it).",
    )
    max_body: ByteSize = Field(ByteSize(25 * 1024**2), description="Largest request body.")
    limits: LimitsConfig = Field(
        default_factory=LimitsConfig,
        description="Per-route body sizes and item counts; beyond one, 413 or 400 naming "
        "the key (its own table below).",
    )
    rate_limit: RateLimitConfig | None = Field(
        None,
        description="Per-key token bucket on /v1 and /api, {requests_per_s: 5, burst: 10} "
        "(per client address without api_keys); beyond it 429 with Retry-After. None by default.",
    )
    data_dir: str = Field("./accelmux-data", description="SQLite jobs and logs.")
    sample_interval_s: float = Field(1.0, gt=0, description="Memory sampling period.")
    drain_s: float = Field(
        10.0, ge=0, le=3600, description="At shutdown, how long in-flight requests may finish."
    )
    default_max_tokens: int = Field(
        512, ge=1, description="Output tokens assumed when a request sets no max_tokens."
    )
    access_log: bool = Field(False, description="Log one line per HTTP request.")
    jobs: bool = Field(True, description="Serve durable batch jobs at /v1/jobs.")
    dashboard: bool = Field(True, description="Serve the dashboard at / (data under /admin).")
    event_loop: Literal["auto", "asyncio", "uvloop"] = Field(
        "auto", description="auto: uvloop when installed (faster), else asyncio."
    )
    hot_path: bool = Field(
        True,
        description="Serve plain chat, completion and embeddings requests on the hot path "
        "(httptools on uvloop, the same checks); false: every request through aiohttp "
        "(docs/architecture.md).",
    )
    allowed_hosts: list[str] | None = Field(
        None,
        description="Host header names the daemon answers to (any port), against DNS "
        "rebinding; other names get 403 host_not_allowed (/health excepted). None: "
        "localhost, 127.0.0.1 and [::1], plus server.host when it is a specific address "
        "(any IP literal when it is 0.0.0.0/::). Add the names clients use (a reverse "
        'proxy\'s public name); ["*"] turns the check off.',
    )
    cors_origins: list[str] = Field(
        default_factory=list,
        description="Origins (https://app.example:8443) whose pages may call the API from a "
        "browser: preflights are answered and Access-Control-Allow-Origin is sent for them "
        "only, and their POST/PUT/PATCH/DELETE pass the cross-site check. None by default "
        "(same-origin only).",
    )
    header_timeout_s: float = Field(
        15.0,
        gt=0,
        le=3600,
        description="A new connection must send complete request headers within this "
        "(slow-header clients are cut off).",
    )
    body_timeout_s: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="While a request body is arriving, the longest pause between two of its "
        "bytes before the connection is closed (a slow but steady upload is never cut).",
    )
    keepalive_timeout_s: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="An idle keep-alive connection is closed after this; the next request's "
        "headers must be complete within it.",
    )
    max_connections: int = Field(
        1000,
        ge=1,
        le=1_000_000,
        description="Simultaneous HTTP connections; at the cap the oldest one without a "
        "request in progress is closed for a newcomer, and when every one is busy the "
        "newcomer gets 503 too_many_connections and Connection: close.",
    )
    connections_per_address: int = Field(
        256,
        ge=1,
        le=1_000_000,
        description="Connections one client address (an IPv6 /64) may hold; one more closes "
        "that client's oldest idle connection, or gets 429 per_client_limit and "
        "Connection: close. Behind a reverse proxy every client is the proxy's address: "
        "raise it and give each client its own API key.",
    )
    connections_per_key: int = Field(
        256,
        ge=1,
        le=1_000_000,
        description="Connections whose request authenticated with one API key (or the admin "
        "key); one more closes that key's oldest idle connection, or gets 429 "
        "per_client_limit and Connection: close.",
    )
    reserved_connections: int = Field(
        32,
        ge=0,
        le=1_000_000,
        description="Of server.max_connections (at most a quarter of it), kept for /health "
        "and requests to realtime services: once the others are taken, a newcomer asking "
        "anything else gets 503 too_many_connections.",
    )
    min_body_rate: ByteSize = Field(
        ByteSize(1024),
        ge=0,
        description="Bytes a second a request body must arrive at, counted over "
        "server.body_rate_window_s while the daemon reads it; a slower upload is cut with "
        "408 body_too_slow (0: no minimum).",
    )
    body_rate_window_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="The window server.min_body_rate is counted over (a body that arrives "
        "whole within it is never cut).",
    )
    wyoming: WyomingConfig | None = Field(
        None,
        description="A Wyoming server for Home Assistant's voice pipeline, "
        "{host: 127.0.0.1, port: 10300}: speech-to-text and text-to-speech on one port. "
        "None (off) by default.",
    )
