from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from accelmux.jobs import JobNotFoundError, JobStateError, JobStore, JobStoreLockedError
from accelmux.jobs.store import DB_NAME

from .support import FakeClock, digest


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> Iterator[JobStore]:
    s = JobStore.open(tmp_path, max_attempts=3, clock=clock)
    yield s
    s.close()


def test_pragmas_wal_and_full(store: JobStore) -> None:
    db = sqlite3.connect(store.path)
    try:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        db.close()
    assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_create_and_get(store: JobStore, clock: FakeClock) -> None:
    job = store.create_job("embed", ["a", "b", "c"], metadata={"source": "notes"})
    assert job.id.startswith("job_")
    assert job.status == "queued"
    assert job.counts.total == job.counts.pending == 3
    assert job.created_at == clock.now
    assert job.metadata == {"source": "notes"}
    assert store.get_job(job.id) == job
    with pytest.raises(JobNotFoundError):
        store.get_job("job_nope")


def test_create_rejects_empty(store: JobStore) -> None:
    with pytest.raises(ValueError):
        store.create_job("embed", [])
    with pytest.raises(ValueError):
        store.create_job("", ["a"])
    with pytest.raises(TypeError):
        store.create_job("embed", ["a", 3])  # type: ignore[list-item]


def test_claim_complete_finishes_job(store: JobStore, clock: FakeClock) -> None:
    job = store.create_job("embed", [f"t{i}" for i in range(5)])
    lease = store.claim(job.id, 3)
    assert lease is not None
    assert lease.indexes == [0, 1, 2]
    assert [item.attempt for item in lease.inputs] == [1, 1, 1]
    running = store.get_job(job.id)
    assert running.status == "running"
    assert running.started_at == clock.now
    assert (running.counts.pending, running.counts.leased) == (2, 3)
    assert store.complete(lease, {i.index: digest(i.text) for i in lease.inputs}) == 3
    second = store.claim(job.id, 10)
    assert second is not None and second.indexes == [3, 4]
    assert store.claim(job.id, 10) is None
    clock.advance(2)
    store.complete(second, {3: digest("t3"), 4: digest("t4")})
    done = store.get_job(job.id)
    assert done.status == "completed"
    assert done.finished_at == clock.now
    assert done.counts.done == 5
    items = store.results(job.id)
    assert [(r.index, r.state, r.result) for r in items] == [
        (i, "done", digest(f"t{i}")) for i in range(5)
    ]
    assert store.check() == []


def test_duplicate_and_stale_completion_is_ignored(store: JobStore) -> None:
    job = store.create_job("embed", ["a", "b"])
    lease = store.claim(job.id, 2)
    assert lease is not None
    assert store.complete(lease, {0: "first"}) == 1
    assert store.complete(lease, {0: "second"}) == 0  # already done
    store.recover()  # input 1 back to pending: the old token is stale
    assert store.complete(lease, {1: "late"}) == 0
    fresh = store.claim(job.id, 2)
    assert fresh is not None and fresh.indexes == [1]
    assert fresh.inputs[0].attempt == 2
    assert store.complete(fresh, {1: "ok"}) == 1
    assert [r.result for r in store.results(job.id)] == ["first", "ok"]
    assert store.check() == []


def test_results_table_refuses_a_second_row(store: JobStore) -> None:
    job = store.create_job("embed", ["a"])
    lease = store.claim(job.id, 1)
    assert lease is not None
    store.complete(lease, {0: 1})
    with pytest.raises(sqlite3.IntegrityError):
        store._db.execute(
            "INSERT INTO results (job_id, idx, result, completed_at) VALUES (?, 0, '2', 0)",
            (job.id,),
        )


def test_retry_backoff_then_fail_after_max_attempts(store: JobStore, clock: FakeClock) -> None:
    job = store.create_job("embed", ["a"])
    for attempt in (1, 2):
        lease = store.claim(job.id, 1)
        assert lease is not None and lease.inputs[0].attempt == attempt
        assert store.retry(lease, [0], "JobInputRetry: busy", delay=10.0) == 1
        assert store.claim(job.id, 1) is None  # backing off
        assert store.next_wakeup() == clock.now + 10.0
        assert store.runnable_jobs() == []
        clock.advance(10.0)
        assert store.runnable_jobs() == [(job.id, "embed", "running")]
        assert store.next_wakeup() == clock.now  # ready now
        assert store.pending_count() == 1
    lease = store.claim(job.id, 1)
    assert lease is not None
    assert store.retry(lease, [0], "JobInputRetry: still busy", delay=10.0) == 0
    failed = store.get_job(job.id)
    assert failed.status == "failed"
    assert failed.error == "every input failed"
    [item] = store.results(job.id)
    assert (item.state, item.attempts, item.error) == ("failed", 3, "JobInputRetry: still busy")
    assert store.check() == []


def test_fail_some_still_completes(store: JobStore) -> None:
    job = store.create_job("embed", ["a", "b"])
    lease = store.claim(job.id, 2)
    assert lease is not None
    store.fail(lease, [0], "JobInputError: too long")
    store.complete(lease, {1: "ok"})
    final = store.get_job(job.id)
    assert final.status == "completed"
    assert (final.counts.done, final.counts.failed) == (1, 1)


def test_release_does_not_count_the_attempt(store: JobStore) -> None:
    job = store.create_job("embed", ["a", "b"])
    lease = store.claim(job.id, 2)
    assert lease is not None
    assert store.release(lease) == 2
    again = store.claim(job.id, 2)
    assert again is not None and [i.attempt for i in again.inputs] == [1, 1]


def test_cancel(store: JobStore) -> None:
    job = store.create_job("embed", ["a", "b", "c", "d"])
    lease = store.claim(job.id, 2)
    assert lease is not None
    cancelled = store.cancel_job(job.id)
    assert cancelled.status == "cancelled"
    assert (cancelled.counts.cancelled, cancelled.counts.leased) == (2, 2)
    assert store.claim(job.id, 10) is None
    assert store.runnable_jobs() == []
    # in-flight inputs finish and keep their result, or end cancelled
    assert store.complete(lease, {0: "kept"}) == 1
    assert store.retry(lease, [1], "busy", delay=1.0) == 0
    final = store.get_job(job.id)
    assert final.status == "cancelled"
    assert (final.counts.done, final.counts.cancelled, final.counts.leased) == (1, 3, 0)
    assert store.cancel_job(job.id).status == "cancelled"  # idempotent
    assert store.check() == []


def test_cancel_finished_job_is_a_state_error(store: JobStore) -> None:
    job = store.create_job("embed", ["a"])
    lease = store.claim(job.id, 1)
    assert lease is not None
    store.complete(lease, {0: 0})
    with pytest.raises(JobStateError):
        store.cancel_job(job.id)
    with pytest.raises(JobNotFoundError):
        store.cancel_job("job_missing")


def test_pause_and_resume(store: JobStore) -> None:
    job = store.create_job("embed", ["a", "b"])
    assert store.set_paused(job.id, True)
    assert store.get_job(job.id).status == "paused"
    assert store.next_wakeup() is None  # a paused job waits for its window, not a time
    assert store.pending_count() == 2
    assert not store.set_paused(job.id, True)
    assert store.set_paused(job.id, False)
    assert store.get_job(job.id).status == "queued"  # never started
    lease = store.claim(job.id, 1)
    assert lease is not None
    store.set_paused(job.id, True)
    store.set_paused(job.id, False)
    assert store.get_job(job.id).status == "running"


def test_reopen_recovers_leases_and_counts_interruptions(tmp_path: Path) -> None:
    clock = FakeClock()
    store = JobStore.open(tmp_path, max_attempts=2, clock=clock)
    job = store.create_job("embed", ["a", "b", "c"])
    first = store.claim(job.id, 3)
    assert first is not None
    store.complete(first, {0: "a"})
    store.close()  # as if killed with inputs 1 and 2 leased

    store = JobStore.open(tmp_path, max_attempts=2, clock=clock)
    view = store.get_job(job.id)
    assert (view.counts.pending, view.counts.leased, view.counts.done) == (2, 0, 1)
    second = store.claim(job.id, 3)
    assert second is not None and [i.attempt for i in second.inputs] == [2, 2]
    store.close()  # killed again: their attempts are used up

    store = JobStore.open(tmp_path, max_attempts=2, clock=clock)
    try:
        final = store.get_job(job.id)
        assert final.status == "completed"
        assert (final.counts.done, final.counts.failed) == (1, 2)
        assert "interrupted" in (store.results(job.id)[1].error or "")
        assert store.check() == []
    finally:
        store.close()


def test_recover_cancels_leases_of_cancelled_jobs(tmp_path: Path) -> None:
    store = JobStore.open(tmp_path)
    job = store.create_job("embed", ["a", "b"])
    assert store.claim(job.id, 1) is not None
    store.cancel_job(job.id)
    store.close()
    with JobStore.open(tmp_path) as store:
        view = store.get_job(job.id)
        assert (view.status, view.counts.cancelled, view.counts.leased) == ("cancelled", 2, 0)


def test_one_process_owns_a_data_directory(tmp_path: Path) -> None:
    with JobStore.open(tmp_path), pytest.raises(JobStoreLockedError):
        JobStore.open(tmp_path)
    JobStore.open(tmp_path).close()  # free again once closed
    assert (tmp_path / DB_NAME).exists()


def test_list_jobs_pages_newest_first(store: JobStore) -> None:
    ids = [store.create_job("embed", [str(i)]).id for i in range(5)]
    page, more = store.list_jobs(limit=2)
    assert [j.id for j in page] == ids[::-1][:2] and more
    page2, more2 = store.list_jobs(limit=2, after=page[-1].id)
    assert [j.id for j in page2] == ids[::-1][2:4] and more2
    page3, more3 = store.list_jobs(limit=2, after=page2[-1].id)
    assert [j.id for j in page3] == [ids[0]] and not more3
    with pytest.raises(JobNotFoundError):
        store.list_jobs(after="job_unknown")


def test_results_paging(store: JobStore) -> None:
    job = store.create_job("embed", [f"t{i}" for i in range(10)])
    lease = store.claim(job.id, 4)
    assert lease is not None
    store.complete(lease, {i: {"vec": [i]} for i in lease.indexes})
    page = store.results(job.id, offset=2, limit=4)
    assert [(r.index, r.state, r.result) for r in page] == [
        (2, "done", {"vec": [2]}),
        (3, "done", {"vec": [3]}),
        (4, "pending", None),
        (5, "pending", None),
    ]
    assert store.results(job.id, offset=10) == []
    with pytest.raises(JobNotFoundError):
        store.results("job_x")
    with pytest.raises(ValueError):
        store.results(job.id, offset=-1)


def test_unserialisable_result_writes_nothing(store: JobStore) -> None:
    job = store.create_job("embed", ["a", "b"])
    lease = store.claim(job.id, 2)
    assert lease is not None
    with pytest.raises(TypeError):
        store.complete(lease, {0: "fine", 1: object()})
    assert store.get_job(job.id).counts.done == 0
    assert store.check() == []
