"""The small guards the reliability cases rely on, tested directly: the token bucket, the
media sniffers, and a Fail that arrives between a Dispatch and the start of its attempt."""

from __future__ import annotations

import asyncio

from accelmux.backends.fake_outputs import png, wav
from accelmux.config.server import RateLimitConfig
from accelmux.core.actions import Dispatch, Fail
from accelmux.core.types import Reason
from accelmux.gateway.media import looks_like_audio, looks_like_image
from accelmux.gateway.middleware import TokenBuckets
from accelmux.runtime.requests import Ticket


def test_token_bucket_refills_at_its_rate_and_forgets_old_callers() -> None:
    now = [0.0]
    buckets = TokenBuckets(RateLimitConfig(requests_per_s=2, burst=3), clock=lambda: now[0])
    assert [buckets.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take("a") == 0.5  # one token takes 1/2 s
    assert buckets.take("b") == 0.0  # another caller, another bucket
    now[0] += 0.5
    assert buckets.take("a") == 0.0
    buckets.MAX_BUCKETS = 4
    for i in range(10):
        buckets.take(f"c{i}")
    assert len(buckets._buckets) == 4


def test_media_sniffers() -> None:
    assert looks_like_audio(wav(b"s", 0.1))
    assert looks_like_audio(b"ID3\x04" + b"\0" * 20) and looks_like_audio(b"OggS\0\0")
    assert looks_like_audio(b"\0\0\0\x20ftypM4A ")  # MP4/M4A
    assert not looks_like_audio(b"") and not looks_like_audio(b"hello world")
    assert not looks_like_audio(b"RIFF\0\0\0\0AVI LIST")
    assert looks_like_image(png(b"s", 4, 4))
    assert not looks_like_image(png(b"s", 4, 4)[:12]) and not looks_like_image(b"GIF")
    assert not looks_like_image(b"\xff\xd8\xff")  # a JPEG marker with no frame header


def test_fail_between_dispatch_and_attempt_stops_the_attempt() -> None:
    async def body() -> None:
        ticket = Ticket("r1", "chat", 0.0)
        ticket.deliver(
            Dispatch(request_id="r1", service="chat", reason=Reason.FITS, attempt=1, lease_bytes=0)
        )
        ticket.deliver(Fail(request_id="r1", service="chat", reason=Reason.BACKEND_CRASHED))
        assert isinstance(await ticket.future, Dispatch)
        assert isinstance(ticket.interrupt, Fail)  # run_request sees it before starting

    asyncio.run(body())
