"""A shared worker measures each request's peak from the process's RSS, and keeps out of
it what a concurrent load or unload of another model moves (accelmux.worker.peaks).

Before, a voice request that ran while another service's model loaded in the same worker
was measured at that model's size (``bench_stack_llms.py``: the voice chain's chat request
learned a 302 MiB peak from Gemma's load beside it, where it uses about 10 MiB).
"""

from __future__ import annotations

from accelmux.worker.peaks import PeakSampler

MIB = 2**20


class Rss:
    """The process's RSS as the test sets it (a test double of ``rss_bytes``)."""

    def __init__(self) -> None:
        self.value = 1000 * MIB

    def __call__(self) -> int:
        return self.value


def _sampler() -> tuple[PeakSampler, Rss]:
    rss = Rss()
    return PeakSampler(rss, sample_s=0.001), rss


def test_a_request_alone_is_charged_its_growth() -> None:
    sampler, rss = _sampler()
    token = sampler.begin()
    rss.value += 40 * MIB
    sampler.sample()
    rss.value -= 30 * MIB
    assert sampler.end(token) == 40 * MIB


def test_a_load_beside_a_request_is_not_its_peak() -> None:
    sampler, rss = _sampler()
    token = sampler.begin()
    rss.value += 10 * MIB  # the request's own
    sampler.sample()
    sampler.hold()
    rss.value += 300 * MIB  # another model's weights
    sampler.sample()
    sampler.release()
    rss.value += 5 * MIB  # the request again
    sampler.sample()
    assert sampler.current(token) == 15 * MIB
    assert sampler.end(token) == 15 * MIB


def test_an_unload_beside_a_request_does_not_hide_its_growth() -> None:
    sampler, rss = _sampler()
    token = sampler.begin()
    sampler.hold()
    rss.value -= 200 * MIB  # another model freed
    sampler.release()
    rss.value += 25 * MIB
    sampler.sample()
    assert sampler.end(token) == 25 * MIB


def test_a_request_that_begins_during_a_load_is_measured_from_its_own_start() -> None:
    sampler, rss = _sampler()
    sampler.hold()
    rss.value += 100 * MIB
    token = sampler.begin()  # mid-load
    rss.value += 200 * MIB  # the rest of the load
    sampler.release()
    rss.value += 8 * MIB
    sampler.sample()
    assert sampler.end(token) == 8 * MIB


def test_a_request_that_ends_during_a_load_keeps_what_it_had() -> None:
    sampler, rss = _sampler()
    token = sampler.begin()
    rss.value += 12 * MIB
    sampler.sample()
    sampler.hold()
    rss.value += 300 * MIB
    assert sampler.end(token) == 12 * MIB
    sampler.release()


def test_a_paused_request_is_charged_only_its_running_spans() -> None:
    sampler, rss = _sampler()
    token = sampler.begin()
    rss.value += 20 * MIB
    sampler.sample()
    sampler.suspend(token)
    rss.value += 500 * MIB  # others, while it waits
    sampler.resume(token)
    rss.value += 10 * MIB
    sampler.sample()
    assert sampler.end(token) == 20 * MIB
