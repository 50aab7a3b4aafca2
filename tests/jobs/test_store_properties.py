"""Property: whatever the interleaving of lease, complete, retry, fail, release, cancel and
crash-recover, every input ends recorded exactly once (or failed, or cancelled)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from accelmux.jobs import JobStore, Lease

from .support import FakeClock, digest

MAX_ATTEMPTS = 3


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="accelmux-jobs-"))
        self.clock = FakeClock()
        self.store = JobStore.open(self.dir, max_attempts=MAX_ATTEMPTS, clock=self.clock)
        self.jobs: dict[str, list[str]] = {}
        self.leases: list[Lease] = []  # every lease ever handed out, stale ones included
        self.ended: dict[tuple[str, int], tuple[str, object]] = {}  # terminal, never change

    # ------------------------------------------------------------ helpers

    def _state(self, job_id: str, idx: int) -> tuple[str, str | None]:
        row = self.store._db.execute(
            "SELECT state, lease_token FROM inputs WHERE job_id = ? AND idx = ?", (job_id, idx)
        ).fetchone()
        return row[0], row[1]

    def _held(self, lease: Lease, indexes: list[int]) -> int:
        return sum(self._state(lease.job_id, i) == ("leased", lease.token) for i in indexes)

    @staticmethod
    def _subset(lease: Lease, mask: int) -> list[int]:
        return [i for n, i in enumerate(lease.indexes) if mask >> n & 1]

    # ------------------------------------------------------------ rules

    @rule(n=st.integers(1, 6))
    def create(self, n: int) -> None:
        texts = [f"job{len(self.jobs)}-text{i}" for i in range(n)]
        job = self.store.create_job("embed", texts)
        self.jobs[job.id] = texts

    @precondition(lambda self: self.jobs)
    @rule(pick=st.integers(0, 100), limit=st.integers(1, 4))
    def claim(self, pick: int, limit: int) -> None:
        job_id = list(self.jobs)[pick % len(self.jobs)]
        lease = self.store.claim(job_id, limit)
        if lease is not None:
            assert all(self._state(job_id, i) == ("leased", lease.token) for i in lease.indexes)
            assert all(1 <= item.attempt <= MAX_ATTEMPTS for item in lease.inputs)
            assert all(item.text == self.jobs[job_id][item.index] for item in lease.inputs)
            self.leases.append(lease)

    @precondition(lambda self: self.leases)
    @rule(pick=st.integers(0, 100), mask=st.integers(0, 15))
    def complete(self, pick: int, mask: int) -> None:
        lease = self.leases[pick % len(self.leases)]
        chosen = self._subset(lease, mask)
        expected = self._held(lease, chosen)
        texts = self.jobs[lease.job_id]
        assert self.store.complete(lease, {i: digest(texts[i]) for i in chosen}) == expected

    @precondition(lambda self: self.leases)
    @rule(pick=st.integers(0, 100), mask=st.integers(0, 15), delay=st.sampled_from([0.0, 5.0]))
    def retry(self, pick: int, mask: int, delay: float) -> None:
        lease = self.leases[pick % len(self.leases)]
        self.store.retry(lease, self._subset(lease, mask), "JobInputRetry: 503", delay)

    @precondition(lambda self: self.leases)
    @rule(pick=st.integers(0, 100), mask=st.integers(0, 15))
    def fail(self, pick: int, mask: int) -> None:
        lease = self.leases[pick % len(self.leases)]
        chosen = self._subset(lease, mask)
        expected = self._held(lease, chosen)
        assert self.store.fail(lease, chosen, "JobInputError: bad") == expected

    @precondition(lambda self: self.leases)
    @rule(pick=st.integers(0, 100))
    def release(self, pick: int) -> None:
        self.store.release(self.leases[pick % len(self.leases)])

    @precondition(lambda self: self.jobs)
    @rule(pick=st.integers(0, 100))
    def cancel(self, pick: int) -> None:
        job_id = list(self.jobs)[pick % len(self.jobs)]
        if self.store.get_job(job_id).status in ("completed", "failed"):
            return
        assert self.store.cancel_job(job_id).counts.pending == 0

    @rule()
    def crash_and_recover(self) -> None:
        self.store.close()
        self.store = JobStore.open(self.dir, max_attempts=MAX_ATTEMPTS, clock=self.clock)
        assert self.store._db.execute(
            "SELECT COUNT(*) FROM inputs WHERE state = 'leased'"
        ).fetchone() == (0,)

    @rule(seconds=st.sampled_from([1.0, 5.0]))
    def tick(self, seconds: float) -> None:
        self.clock.advance(seconds)

    # ------------------------------------------------------------ invariants

    @invariant()
    def sound(self) -> None:
        assert self.store.check() == []

    @invariant()
    def ended_inputs_stay_ended(self) -> None:
        for job_id, texts in self.jobs.items():
            for item in self.store.results(job_id, limit=len(texts)):
                key = (job_id, item.index)
                if item.state in ("done", "failed", "cancelled"):
                    now = (item.state, item.result)
                    assert self.ended.setdefault(key, now) == now
                    if item.state == "done":
                        assert item.result == digest(texts[item.index])
                else:
                    assert key not in self.ended

    def teardown(self) -> None:
        try:
            self._drive_to_the_end()
        finally:
            self.store.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def _drive_to_the_end(self) -> None:
        """Restart once more, then complete everything: each input ends exactly once."""
        self.crash_and_recover()
        self.clock.advance(1000)
        for job_id, texts in self.jobs.items():
            while (lease := self.store.claim(job_id, 4)) is not None:
                self.store.complete(lease, {i.index: digest(i.text) for i in lease.inputs})
            job = self.store.get_job(job_id)
            assert job.status in ("completed", "failed", "cancelled")
            assert job.counts.pending == job.counts.leased == 0
            rows = self.store._db.execute(
                "SELECT idx, result FROM results WHERE job_id = ? ORDER BY idx", (job_id,)
            ).fetchall()
            assert len(rows) == len({idx for idx, _ in rows}) == job.counts.done
            for item in self.store.results(job_id, limit=len(texts)):
                assert item.state in ("done", "failed", "cancelled")
                if item.state == "done":
                    assert item.result == digest(texts[item.index])
                if job.status != "cancelled":
                    assert item.state != "cancelled"
        self.sound()
        self.ended_inputs_stay_ended()


StoreMachine.TestCase.settings = settings(
    max_examples=50,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestStoreProperties = StoreMachine.TestCase
