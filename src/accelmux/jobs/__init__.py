"""Durable batch jobs: embeddings and indexing work that survives restarts.

A job holds N text inputs for one model; :class:`JobStore` keeps it in SQLite under the
data directory and records each input's result exactly once (see ``store.py``),
:class:`JobRunner` feeds pending inputs in small batches to an injected ``submit``
(the daemon's path through the Manager), ``http.job_routes`` serves ``/v1/jobs``, and
``command.py`` adds ``accelmux jobs ...``.

Wiring in the daemon::

    store = JobStore.open(data_dir)                   # locks the directory, recovers leases
    runner = JobRunner(store, submit, window_open=window_open)
    app.add_routes(job_routes(store, runner, models=lambda: services))
    await runner.start()
    ...
    await runner.stop()
    store.close()
"""

from accelmux.jobs.errors import (
    JobError,
    JobInputError,
    JobInputRetry,
    JobNotFoundError,
    JobStateError,
    JobStoreLockedError,
)
from accelmux.jobs.model import Job, JobCounts, JobStatus, Lease, ResultItem
from accelmux.jobs.runner import JobRunner, RunnerSettings, Submit, WindowOpen
from accelmux.jobs.store import JobStore

__all__ = [
    "Job",
    "JobCounts",
    "JobError",
    "JobInputError",
    "JobInputRetry",
    "JobNotFoundError",
    "JobRunner",
    "JobStateError",
    "JobStatus",
    "JobStore",
    "JobStoreLockedError",
    "Lease",
    "ResultItem",
    "RunnerSettings",
    "Submit",
    "WindowOpen",
]
