"""The job runner: feeds pending inputs, in small batches, to an injected ``submit``.

``submit(service, inputs) -> results`` is the only way out: the daemon plugs in a function
that sends the request through the Manager (batch class, maintenance windows,
preemption), so the Manager decides *when* a batch runs. The runner decides only *how
much* is outstanding: ``max_outstanding`` worker tasks each hold at most one batch (a
closed loop), so nothing queues up beyond K requests however large the jobs are.

What happens to a batch::

    submit returns N results      -> recorded (store.complete), one transaction
    JobInputRetry / other error   -> back to pending after a backoff (Retry-After wins if
                                     longer); failed once max_attempts are used
    JobInputError                 -> failed; a batch of several is retried input by input
                                     first, so one bad input does not fail its neighbours
    submit's request cancelled    -> like JobInputRetry (a batch preempted by the Manager)
    runner stopped (cancelled)    -> given back untried (the attempt is not counted)

``window_open(model) -> bool`` (optional) tells whether a model may run now; while it
says no, the model's jobs show status ``paused`` and none of their inputs start.

``beside_realtime(model) -> bool`` (optional) tells whether realtime services share the
model's device. While they do, a batch is cut to about ``slice_s`` seconds of compute,
paced by what the model's last batches took once dispatched (``submit`` returns a
:class:`Ran` to say): the Manager holds the next batch while voice work runs, but one
already running keeps the device's compute until it ends, so its length bounds how long
a voice request that arrives meanwhile shares the device with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from accelmux.errors import BackendError
from accelmux.jobs.errors import JobInputError, JobInputRetry
from accelmux.jobs.model import Lease
from accelmux.jobs.store import JobStore

log = logging.getLogger("accelmux.jobs")


@dataclass(frozen=True, slots=True)
class Ran:
    """What ``submit`` may return instead of the bare results: the results and the seconds
    the backend took once the batch was dispatched (no queue wait in it), which pace the
    batches beside realtime work."""

    results: Sequence[Any]
    run_s: float | None = None


Submit = Callable[[str, list[str]], Awaitable[Sequence[Any] | Ran]]
WindowOpen = Callable[[str], bool]
BesideRealtime = Callable[[str], bool]
#: A model's batch now: (the fraction of ``batch_size`` to claim, the most batches of it
#: in flight at once), as the Manager last set them (a Rebatch of a service that may
#: shrink); (1.0, ``max_outstanding``) when it never shrank.
BatchOf = Callable[[str], tuple[float, int]]

_MAX_ERROR_CHARS = 500


@dataclass(frozen=True, slots=True, kw_only=True)
class RunnerSettings:
    batch_size: int = 32
    max_outstanding: int = 2
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    #: How long an idle worker sleeps before it looks again (windows open by the clock).
    idle_poll_s: float = 5.0
    #: Limit on one ``submit`` call; None leaves waiting to the Manager.
    request_timeout_s: float | None = None
    #: Compute per batch while realtime services share the model's device (0: batches
    #: stay ``batch_size``): what a voice request may find running when it arrives.
    slice_s: float = 0.0

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.max_outstanding < 1:
            raise ValueError("batch_size and max_outstanding must be at least 1")
        if self.slice_s < 0:
            raise ValueError("slice_s must not be negative")
        if self.backoff_base_s < 0 or self.backoff_max_s < 0 or self.idle_poll_s <= 0:
            raise ValueError("backoff times must not be negative; idle_poll_s must be positive")

    def backoff(self, attempt: int) -> float:
        """Delay before the next try after ``attempt`` failed tries (exponential, capped)."""
        return float(min(self.backoff_max_s, self.backoff_base_s * 2 ** max(0, attempt - 1)))


class Pace:
    """Seconds per input of one model's recent batches, once dispatched: the median of
    the last ``window`` (a batch of long texts or a busy moment moves it little)."""

    def __init__(self, window: int = 16) -> None:
        self.per_input: deque[float] = deque(maxlen=window)

    def add(self, run_s: float, inputs: int) -> None:
        if inputs > 0 and run_s >= 0:
            self.per_input.append(run_s / inputs)

    def seconds_per_input(self) -> float | None:
        return statistics.median(self.per_input) if self.per_input else None

    def inputs_within(self, seconds: float) -> int | None:
        """How many inputs take about ``seconds``, at least one; None before any batch."""
        per = self.seconds_per_input()
        if per is None or per <= 0:
            return None
        # a pace too small to measure (a subnormal) would overflow: no batch is that large
        return max(1, int(min(seconds / per, float(1 << 30))))


class JobRunner:
    """Runs the pending inputs of every active job of a :class:`JobStore`."""

    def __init__(
        self,
        store: JobStore,
        submit: Submit,
        *,
        settings: RunnerSettings | None = None,
        window_open: WindowOpen | None = None,
        batch_of: BatchOf | None = None,
        beside_realtime: BesideRealtime | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.settings = settings or RunnerSettings()
        self._submit = submit
        self._window_open = window_open
        self._batch_of = batch_of
        self._beside_realtime = beside_realtime
        #: Per model: its batches' pace, and the size a batch was last cut to beside
        #: realtime work (absent while batches are not cut).
        self.pace: dict[str, Pace] = {}
        self.sliced: dict[str, int] = {}
        #: Batches claimed and not yet recorded, per model (held against its parallelism).
        self.holding: dict[str, int] = {}
        self._clock = clock
        self._wakeup = asyncio.Event()
        self._workers: list[asyncio.Task[None]] = []
        self.outstanding = 0  # batches inside submit right now

    # ---------------------------------------------------------------- lifecycle

    def wake(self) -> None:
        """Look for work now (a job was created, cancelled or a window opened)."""
        self._wakeup.set()

    @property
    def running(self) -> bool:
        return any(not task.done() for task in self._workers)

    async def start(self) -> None:
        """Start ``max_outstanding`` workers in the background (idempotent)."""
        if self.running:
            return
        self._workers = [
            asyncio.create_task(self._worker(stop_when_idle=False), name=f"jobs-worker-{i}")
            for i in range(self.settings.max_outstanding)
        ]

    async def stop(self) -> None:
        """Stop the workers; batches in flight are given back untried."""
        workers, self._workers = self._workers, []
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)

    async def run_until_idle(self) -> None:
        """Work in the foreground until no input of an active job is pending or leased.

        Inputs of a model whose window is closed stay pending, so this waits for the window.
        """
        workers = [
            asyncio.create_task(self._worker(stop_when_idle=True))
            for _ in range(self.settings.max_outstanding)
        ]
        try:
            await asyncio.gather(*workers)
        finally:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    # ---------------------------------------------------------------- the loop

    async def _worker(self, *, stop_when_idle: bool) -> None:
        while True:
            self._wakeup.clear()
            try:
                lease = await self._claim_next()
                if lease is None:
                    if stop_when_idle and await asyncio.to_thread(self._idle):
                        return
                    await self._sleep_until_work()
                    continue
                await self._process(lease)
            except asyncio.CancelledError:
                raise
            except Exception:  # a store failure (disk full...): log, wait, try again
                log.exception("jobs worker failed; retrying in %.0f s", self.settings.idle_poll_s)
                await asyncio.sleep(self.settings.idle_poll_s)

    def _idle(self) -> bool:
        return self.store.pending_count() == 0

    async def _claim_next(self) -> Lease | None:
        for job_id, model, status in await asyncio.to_thread(self.store.runnable_jobs):
            is_open = self._window_open is None or self._window_open(model)
            if is_open == (status == "paused"):
                await asyncio.to_thread(self.store.set_paused, job_id, not is_open)
            if not is_open:
                continue
            size = self.settings.batch_size
            if self._batch_of is not None:
                fraction, parallel = self._batch_of(model)
                if self.holding.get(model, 0) >= parallel:
                    continue  # its service runs fewer batches at once while shrunk
                size = max(1, int(size * fraction))
            size = self._slice(model, size)
            # the slot is taken before the claim: other workers claim meanwhile
            self.holding[model] = self.holding.get(model, 0) + 1
            lease = await asyncio.to_thread(self.store.claim, job_id, size)
            if lease is not None:
                return lease
            self.holding[model] -= 1
        return None

    def _slice(self, model: str, size: int) -> int:
        """``size`` cut to about ``slice_s`` of the model's compute while realtime
        services share its device (said in the log when the cut changes)."""
        limit = self.settings.slice_s
        beside = self._beside_realtime
        fits = None
        if limit > 0 and beside is not None and model in self.pace and beside(model):
            fits = self.pace[model].inputs_within(limit)
        cut = fits if fits is not None and fits < size else None
        if cut != self.sliced.get(model):
            if cut is None:
                self.sliced.pop(model, None)
                log.info("jobs on %s: batches of %d again", model, size)
            else:
                self.sliced[model] = cut
                log.info(
                    "jobs on %s: batches cut to %d inputs (about %.2f s of compute) while "
                    "realtime services share its device",
                    model,
                    cut,
                    limit,
                )
        return size if cut is None else cut

    async def _sleep_until_work(self) -> None:
        timeout = self.settings.idle_poll_s
        wake_at = await asyncio.to_thread(self.store.next_wakeup)
        if wake_at is not None:
            timeout = max(0.0, min(timeout, wake_at - self._clock()))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._wakeup.wait()

    # ---------------------------------------------------------------- one batch

    async def _process(self, lease: Lease) -> None:
        try:
            await self._run_batch(lease)
        except BaseException:
            # Stopping (or the store failed): whatever is still leased goes back untried.
            # Rows already recorded are no longer leased under this token, so this touches
            # only the rest.
            with contextlib.suppress(Exception):
                self.store.release(lease)
            raise
        finally:
            self.holding[lease.model] = max(0, self.holding.get(lease.model, 1) - 1)

    async def _run_batch(self, lease: Lease) -> None:
        store = self.store
        try:
            results = await self._call(lease.model, [item.text for item in lease.inputs])
        except JobInputError as exc:
            if len(lease.inputs) > 1:
                await self._one_by_one(lease)
            else:
                await asyncio.to_thread(store.fail, lease, lease.indexes, _describe(exc))
            return
        except Exception as exc:
            await self._retry(lease, lease.indexes, exc)
            return
        await self._record(lease, lease.indexes, results)

    async def _one_by_one(self, lease: Lease) -> None:
        for item in lease.inputs:
            job = await asyncio.to_thread(self.store.get_job, lease.job_id)
            if job.status == "cancelled":
                await asyncio.to_thread(self.store.release, lease)  # the rest: cancelled
                return
            try:
                results = await self._call(lease.model, [item.text])
            except JobInputError as exc:
                await asyncio.to_thread(self.store.fail, lease, [item.index], _describe(exc))
            except Exception as exc:
                await self._retry(lease, [item.index], exc)
            else:
                await self._record(lease, [item.index], results)

    async def _call(self, model: str, texts: list[str]) -> Sequence[Any]:
        self.outstanding += 1
        try:
            timeout = self.settings.request_timeout_s
            async with asyncio.timeout(timeout):
                got = await self._submit(model, texts)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the runner is stopping
            # submit's own request was cancelled (preempted by the Manager): try later
            raise JobInputRetry("the request was cancelled (preempted)") from None
        finally:
            self.outstanding -= 1
        if isinstance(got, Ran):
            results = got.results
            if got.run_s is not None:
                self.pace.setdefault(model, Pace()).add(got.run_s, len(texts))
        else:
            results = got
        if len(results) != len(texts):
            raise JobInputRetry(f"the backend returned {len(results)} results for {len(texts)}")
        return results

    async def _record(self, lease: Lease, indexes: list[int], results: Sequence[Any]) -> None:
        try:
            await asyncio.to_thread(
                self.store.complete, lease, dict(zip(indexes, results, strict=True))
            )
        except (TypeError, ValueError) as exc:  # a result that is not JSON
            message = f"the result is not JSON-serialisable: {_describe(exc)}"
            await asyncio.to_thread(self.store.fail, lease, indexes, message)

    async def _retry(self, lease: Lease, indexes: list[int], exc: Exception) -> None:
        attempt = max(item.attempt for item in lease.inputs if item.index in set(indexes))
        delay = self.settings.backoff(attempt)
        if isinstance(exc, JobInputRetry) and exc.retry_after is not None:
            delay = max(delay, exc.retry_after)
        if not isinstance(exc, JobInputRetry | BackendError | TimeoutError):
            log.warning("job %s: submit raised %s; retrying", lease.job_id, _describe(exc))
        await asyncio.to_thread(self.store.retry, lease, indexes, _describe(exc), delay)


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:_MAX_ERROR_CHARS]
