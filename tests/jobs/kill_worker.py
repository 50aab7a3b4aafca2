"""Standalone worker for the kill -9 test: run every pending input of DATA_DIR's jobs.

    python kill_worker.py DATA_DIR SEED

The fake backend is deterministic per input (result = sha256 of the text) and, like a
real one, sometimes fails a request: about 3% of batches raise a retryable error.
Prints "ready" once the store is open and recovered; exits 0 when no work is left.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import sys

from accelmux.errors import BackendCrashedError
from accelmux.jobs import JobInputRetry, JobRunner, JobStore, RunnerSettings


async def work(data_dir: str, seed: int) -> None:
    rng = random.Random(seed)

    async def submit(model: str, texts: list[str]) -> list[str]:
        await asyncio.sleep(0.03)
        roll = rng.random()
        if roll < 0.015:
            raise JobInputRetry("503 model loading")
        if roll < 0.03:
            raise BackendCrashedError("backend process exited")
        return [hashlib.sha256(text.encode()).hexdigest() for text in texts]

    store = JobStore.open(data_dir)
    try:
        print("ready", flush=True)
        settings = RunnerSettings(
            batch_size=25, max_outstanding=4, backoff_base_s=0.01, backoff_max_s=0.05
        )
        await JobRunner(store, submit, settings=settings).run_until_idle()
    finally:
        store.close()


if __name__ == "__main__":
    asyncio.run(work(sys.argv[1], int(sys.argv[2])))
