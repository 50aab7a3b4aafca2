"""Errors of the jobs package.

Hierarchy (under the project root :class:`accelmux.errors.AccelmuxError`)::

    AccelmuxError
    └── JobError                  root of every jobs error
        ├── JobNotFoundError          no job has that id
        ├── JobStateError             the operation does not apply to the job's status
        ├── JobStoreLockedError       another process already owns the jobs data directory
        ├── JobInputRetry             raised by ``submit``: try these inputs again later
        │                             (429, 503, backend crashed or restarting)
        └── JobInputError             raised by ``submit``: these inputs fail for good
                                      (for example too long for the model); no retry

``submit`` may raise anything else too: an unexpected exception is treated like
:class:`JobInputRetry` (the input goes back to pending with a backoff), and after
``max_attempts`` attempts the input is marked failed with the last error message.
"""

from __future__ import annotations

from accelmux.errors import AccelmuxError


class JobError(AccelmuxError):
    """Root of every error of the jobs package."""


class JobNotFoundError(JobError):
    """No job has the given id."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        super().__init__(f"no job with id {job_id!r}")


class JobStateError(JobError):
    """The operation does not apply to the job's current status."""


class JobStoreLockedError(JobError):
    """Another process holds the lock file of the jobs data directory."""


class JobInputRetry(JobError):
    """The inputs could not be processed now; retry later.

    ``retry_after`` (seconds), when given, is the least delay before the next attempt
    (a ``Retry-After`` header of a 429 or 503 answer).
    """

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        self.retry_after = retry_after
        super().__init__(message)


class JobInputError(JobError):
    """The inputs can never be processed as they are; they are marked failed at once.

    When a batch of several inputs raises it, the runner retries each input of the batch
    alone, so one bad input does not fail its neighbours.
    """
