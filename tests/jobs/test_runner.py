from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tests.waiting import async_wait_until

from accelmux.jobs import JobInputError, JobInputRetry, JobRunner, JobStore, RunnerSettings
from accelmux.jobs.runner import Pace, Ran

from .support import digest

FAST = RunnerSettings(batch_size=8, max_outstanding=3, backoff_base_s=0.01, idle_poll_s=0.05)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    s = JobStore.open(tmp_path, max_attempts=3)
    yield s
    s.close()


def run(coro: Awaitable[None], timeout: float = 20.0) -> None:
    async def main() -> None:
        async with asyncio.timeout(timeout):
            await coro

    asyncio.run(main())


class Backend:
    """A fake submit: digests each text; ``behaviour`` may raise first.

    With ``overlap_s``, a call waits (at most that long) until two calls have been in
    flight at once, so whether the runner overlaps its calls does not depend on how fast
    the machine claims the next batch."""

    def __init__(
        self,
        behaviour: Callable[[int, list[str]], None] | None = None,
        *,
        overlap_s: float = 0.0,
    ) -> None:
        self.behaviour = behaviour
        self.overlap_s = overlap_s
        self.calls: list[list[str]] = []
        self.active = 0
        self.peak = 0
        self._overlapped: asyncio.Event | None = None

    async def __call__(self, model: str, texts: list[str]) -> Sequence[Any]:
        assert model == "embed"
        self.calls.append(list(texts))
        self.active += 1
        self.peak = max(self.peak, self.active)
        if self._overlapped is None:
            self._overlapped = asyncio.Event()
        if self.active >= 2:
            self._overlapped.set()
        try:
            if self.overlap_s:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._overlapped.wait(), self.overlap_s)
            await asyncio.sleep(0.002)
            if self.behaviour is not None:
                self.behaviour(len(self.calls), texts)
            return [digest(t) for t in texts]
        finally:
            self.active -= 1


def texts(n: int) -> list[str]:
    return [f"text {i}" for i in range(n)]


def test_runs_a_job_with_at_most_k_outstanding(store: JobStore) -> None:
    job = store.create_job("embed", texts(100))
    backend = Backend(overlap_s=5.0)
    run(JobRunner(store, backend, settings=FAST).run_until_idle())
    final = store.get_job(job.id)
    assert final.status == "completed" and final.counts.done == 100
    assert [r.result for r in store.results(job.id, limit=100)] == [digest(t) for t in texts(100)]
    assert max(len(call) for call in backend.calls) <= 8
    assert sum(len(call) for call in backend.calls) == 100
    assert 2 <= backend.peak <= 3
    assert store.check() == []


def test_retryable_errors_back_off_then_succeed(store: JobStore) -> None:
    job = store.create_job("embed", texts(4))

    def flaky(call: int, _texts: list[str]) -> None:
        if call <= 2:
            raise JobInputRetry("503 loading")

    backend = Backend(flaky)
    settings = RunnerSettings(batch_size=4, max_outstanding=1, backoff_base_s=0.01)
    run(JobRunner(store, backend, settings=settings).run_until_idle())
    final = store.get_job(job.id)
    assert final.status == "completed"
    assert [r.attempts for r in store.results(job.id)] == [3, 3, 3, 3]
    assert len(backend.calls) == 3


def test_retry_after_is_honoured(store: JobStore) -> None:
    store.create_job("embed", ["a"])
    stamps: list[float] = []

    def busy(call: int, _texts: list[str]) -> None:
        stamps.append(time.monotonic())
        if call == 1:
            raise JobInputRetry("429", retry_after=0.3)

    settings = RunnerSettings(max_outstanding=1, backoff_base_s=0.0, idle_poll_s=1.0)
    run(JobRunner(store, Backend(busy), settings=settings).run_until_idle())
    assert stamps[1] - stamps[0] >= 0.29


def test_a_bad_input_fails_alone(store: JobStore) -> None:
    job = store.create_job("embed", ["a", "b", "bad", "c"])

    def picky(_call: int, batch: list[str]) -> None:
        if "bad" in batch:
            raise JobInputError("input too long for the model")

    backend = Backend(picky)
    run(JobRunner(store, backend, settings=FAST).run_until_idle())
    final = store.get_job(job.id)
    assert final.status == "completed"
    assert (final.counts.done, final.counts.failed) == (3, 1)
    bad = store.results(job.id)[2]
    assert bad.state == "failed"
    assert bad.error == "JobInputError: input too long for the model"
    assert bad.attempts == 1


def test_gives_up_after_max_attempts(store: JobStore) -> None:
    job = store.create_job("embed", ["a", "b"])

    def broken(_call: int, _texts: list[str]) -> None:
        raise RuntimeError("backend crashed")

    backend = Backend(broken)
    run(JobRunner(store, backend, settings=FAST).run_until_idle())
    final = store.get_job(job.id)
    assert final.status == "failed" and final.error == "every input failed"
    assert {r.error for r in store.results(job.id)} == {"RuntimeError: backend crashed"}
    assert len(backend.calls) == 3  # max_attempts


def test_wrong_result_count_and_non_json_results_fail(store: JobStore) -> None:
    short = store.create_job("embed", ["a", "b"])

    async def one_result(_model: str, _texts: list[str]) -> list[Any]:
        return ["only one"]

    run(JobRunner(store, one_result, settings=FAST).run_until_idle())
    assert store.get_job(short.id).counts.failed == 2
    assert "returned 1 results for 2" in (store.results(short.id)[0].error or "")

    odd = store.create_job("embed", ["a"])

    async def not_json(_model: str, texts_: list[str]) -> list[Any]:
        return [object() for _ in texts_]

    run(JobRunner(store, not_json, settings=FAST).run_until_idle())
    assert "not JSON-serialisable" in (store.results(odd.id)[0].error or "")


def test_cancel_mid_run_lets_in_flight_finish(store: JobStore) -> None:
    job = store.create_job("embed", texts(40))
    release = asyncio.Event()
    calls: list[list[str]] = []

    async def slow(_model: str, batch: list[str]) -> list[str]:
        calls.append(batch)
        await release.wait()
        return [digest(t) for t in batch]

    async def scenario() -> None:
        runner = JobRunner(store, slow, settings=FAST)
        await runner.start()
        while runner.outstanding < 3:
            await asyncio.sleep(0.01)
        store.cancel_job(job.id)
        runner.wake()
        release.set()
        while store.get_job(job.id).counts.leased:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        await runner.stop()

    run(scenario())
    final = store.get_job(job.id)
    assert final.status == "cancelled"
    assert len(calls) == 3  # nothing new started after the cancel
    assert (final.counts.done, final.counts.cancelled) == (24, 16)
    assert store.check() == []


def test_paused_outside_window_then_resumes(store: JobStore) -> None:
    job = store.create_job("embed", texts(10))
    window = {"embed": False}
    asked: list[str] = []
    backend = Backend()

    def window_open(model: str) -> bool:
        asked.append(model)
        return window[model]

    async def scenario() -> None:
        runner = JobRunner(store, backend, settings=FAST, window_open=window_open)
        await runner.start()
        await async_wait_until(
            lambda: store.get_job(job.id).status == "paused", message="the job to pause"
        )
        assert backend.calls == []
        assert len(asked) < 40  # workers poll every idle_poll_s; they do not spin
        window["embed"] = True
        runner.wake()
        while store.get_job(job.id).status != "completed":
            await asyncio.sleep(0.01)
        await runner.stop()

    run(scenario())
    assert store.get_job(job.id).counts.done == 10


def test_stop_gives_leases_back_untried(store: JobStore) -> None:
    job = store.create_job("embed", texts(30))

    async def forever(_model: str, _texts: list[str]) -> list[str]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def scenario() -> None:
        runner = JobRunner(store, forever, settings=FAST)
        await runner.start()
        await runner.start()  # idempotent
        while runner.outstanding < 3:
            await asyncio.sleep(0.01)
        assert store.get_job(job.id).counts.leased == 24
        await runner.stop()
        assert not runner.running

    run(scenario())
    view = store.get_job(job.id)
    assert (view.counts.pending, view.counts.leased) == (30, 0)
    assert {r.attempts for r in store.results(job.id, limit=30)} == {0}


def test_wake_starts_new_work_at_once(store: JobStore) -> None:
    backend = Backend()

    async def scenario() -> None:
        settings = RunnerSettings(max_outstanding=2, idle_poll_s=30.0)
        runner = JobRunner(store, backend, settings=settings)
        await runner.start()
        await asyncio.sleep(0.05)  # workers now sleep for up to 30 s
        job = store.create_job("embed", ["x"])
        runner.wake()
        async with asyncio.timeout(2.0):
            while store.get_job(job.id).status != "completed":
                await asyncio.sleep(0.01)
        await runner.stop()

    run(scenario())


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        RunnerSettings(batch_size=0)
    with pytest.raises(ValueError):
        RunnerSettings(idle_poll_s=0)
    s = RunnerSettings(backoff_base_s=1.0, backoff_max_s=5.0)
    assert [s.backoff(a) for a in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 5.0]


def test_preempted_or_timed_out_requests_are_retried(store: JobStore) -> None:
    job = store.create_job("embed", ["a", "b"])
    calls: list[int] = []

    async def unlucky(_model: str, batch: list[str]) -> list[str]:
        calls.append(len(batch))
        if len(calls) == 1:
            raise asyncio.CancelledError  # the Manager preempted this request
        if len(calls) == 2:
            await asyncio.sleep(5)  # hangs past request_timeout_s
        return [digest(t) for t in batch]

    settings = RunnerSettings(max_outstanding=1, backoff_base_s=0.01, request_timeout_s=0.05)
    run(JobRunner(store, unlucky, settings=settings).run_until_idle())
    final = store.get_job(job.id)
    assert final.status == "completed"
    assert [r.attempts for r in store.results(job.id)] == [3, 3]
    assert len(calls) == 3


def test_cancel_during_one_by_one_stops_early(store: JobStore) -> None:
    job = store.create_job("embed", ["bad", "a", "b", "c"])
    calls: list[list[str]] = []

    async def picky(_model: str, batch: list[str]) -> list[str]:
        calls.append(batch)
        if "bad" in batch:
            store.cancel_job(job.id)
            raise JobInputError("bad input")
        return [digest(t) for t in batch]

    run(JobRunner(store, picky, settings=FAST).run_until_idle())
    final = store.get_job(job.id)
    assert final.status == "cancelled"
    assert calls == [["bad", "a", "b", "c"]]  # no input is tried alone after the cancel
    assert final.counts.cancelled == 4
    assert store.check() == []


def test_claims_the_batch_the_manager_chose_and_no_more_at_once(store: JobStore) -> None:
    """While its service is shrunk (a Rebatch: a quarter of the batch, one at a time) the
    runner claims 2 inputs of its 8 and keeps one batch in flight; once grown back, full
    batches again, up to max_outstanding at once."""
    job = store.create_job("embed", texts(40))
    # each call leaves 50 ms for a second one to join it: one would, were the limit not kept
    backend = Backend(overlap_s=0.05)
    chosen = {"batch": (0.25, 1)}
    run(
        JobRunner(
            store, backend, settings=FAST, batch_of=lambda m: chosen["batch"]
        ).run_until_idle()
    )
    assert store.get_job(job.id).counts.done == 40
    assert {len(call) for call in backend.calls} == {2} and backend.peak == 1
    job = store.create_job("embed", texts(48))
    grown = Backend(overlap_s=5.0)
    chosen["batch"] = (1.0, 3)
    run(JobRunner(store, grown, settings=FAST, batch_of=lambda m: chosen["batch"]).run_until_idle())
    assert store.get_job(job.id).counts.done == 48
    assert {len(call) for call in grown.calls} == {8} and 2 <= grown.peak <= 3


class TimedBackend:
    """A fake submit that says its batch took ``per_text_s`` per text once dispatched (a
    :class:`Ran`), without taking it: the pace is what the backend reports."""

    def __init__(self, per_text_s: float) -> None:
        self.per_text_s = per_text_s
        self.sizes: list[int] = []

    async def __call__(self, model: str, texts: list[str]) -> Ran:
        self.sizes.append(len(texts))
        await asyncio.sleep(0)
        return Ran([digest(t) for t in texts], self.per_text_s * len(texts))


SLICED = RunnerSettings(batch_size=32, max_outstanding=1, idle_poll_s=0.05, slice_s=0.1)


def test_batches_beside_realtime_work_are_cut_to_the_slice_of_compute(store: JobStore) -> None:
    store.create_job("embed", texts(200))
    backend = TimedBackend(per_text_s=0.02)  # 32 texts: 0.64 s of compute
    runner = JobRunner(store, backend, settings=SLICED, beside_realtime=lambda _m: True)
    run(runner.run_until_idle())
    # the first batch is whole (no pace yet); then about 0.1 s of compute each
    assert backend.sizes[0] == 32
    assert set(backend.sizes[1:-1]) == {5}
    assert sum(backend.sizes) == 200
    assert runner.sliced == {"embed": 5}


def test_batches_stay_whole_without_realtime_work_or_a_slice(store: JobStore) -> None:
    for beside, runner_settings in ((False, SLICED), (True, replace(SLICED, slice_s=0.0))):
        job = store.create_job("embed", texts(100))
        backend = TimedBackend(per_text_s=0.02)
        runner = JobRunner(
            store, backend, settings=runner_settings, beside_realtime=lambda _m, b=beside: b
        )
        run(runner.run_until_idle())
        assert backend.sizes == [32, 32, 32, 4]
        assert runner.sliced == {} and store.get_job(job.id).status == "completed"


def test_a_slice_never_grows_a_batch_and_holds_one_input_at_least(store: JobStore) -> None:
    store.create_job("embed", texts(40))
    backend = TimedBackend(per_text_s=1.0)  # one text is already more than the slice
    runner = JobRunner(store, backend, settings=SLICED, beside_realtime=lambda _m: True)
    run(runner.run_until_idle())
    assert backend.sizes[0] == 32 and set(backend.sizes[1:]) == {1}


@settings(max_examples=200, deadline=None)
@example([5e-324], 1, 1.0)  # a pace too small to divide by: found by the search
@given(
    st.lists(st.floats(min_value=0.0, max_value=10.0), min_size=1, max_size=40),
    st.integers(min_value=1, max_value=64),
    st.floats(min_value=0.001, max_value=5.0),
)
def test_a_pace_cut_is_within_one_input_of_the_slice(
    runs: list[float], inputs: int, slice_s: float
) -> None:
    pace = Pace()
    for run_s in runs:
        pace.add(run_s, inputs)
    per = pace.seconds_per_input()
    assert per is not None
    cut = pace.inputs_within(slice_s)
    if per == 0:
        assert cut is None  # no measure of compute: nothing to cut by
    else:
        assert cut is not None and cut >= 1
        assert cut == 1 or cut * per <= slice_s + 1e-9  # within the slice...
        # ...and not needlessly short (below the cap no batch reaches)
        assert cut == 1 << 30 or (cut + 1) * per > slice_s - 1e-9
