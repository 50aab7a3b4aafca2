"""Service-time and compute-contention model.

Each request has a solo service time (its *work*, in seconds on an otherwise idle
device) from the service's :class:`~accelmux.sim.scenario.ServicePerfConfig`:

- LLM: ``base_s + prompt_tokens / prefill_tps`` of prefill (the first token comes when
  it is done), then ``output_tokens x tbt_s`` of decode;
- ASR (units = audio seconds), TTS (characters), image (megapixels, steps folded into
  ``per_unit_s``), detection (megapixels), embeddings (texts): ``base_s + per_unit_s x
  units``.

Contention is processor sharing with shares: a running request alone uses ``share`` of
the device (a batch-1 LLM decode is memory-bound and leaves room; a diffusion step
takes it all). While the shares of the requests running on a device add up to
``S > 1``, every one of them progresses at ``1/S`` of its solo speed. A share above 1
(measured on a CPU: a request that keeps more threads runnable than there are cores,
as a runtime's spinning thread pool does) runs at its solo speed alone and at
``share/S`` beside others: Linux shares the cores between runnable threads. A job may
also slow the others by a measured *weight* rather than its share (one process's
threads contending for its interpreter's lock, memory bandwidth): see
:meth:`ComputeDevice.rate_of`. So an image job
beside a voice request slows the voice request unless the policy keeps them apart.
A foreign program running on the device (a game) takes its ``compute_share`` the same
way: while it runs, the managed requests progress at ``1/max(1, S + foreign)`` of their
solo speed, and no policy can take that share back.
The oracle's device is ``isolated``: infinite memory and no contention, the bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

EPS = 1e-9


@dataclass(slots=True)
class Job:
    rid: str
    service: str
    share: float
    work: float
    prefill: float
    started_at: float
    done: float = 0.0
    first_token_at: float | None = None
    #: How much it slows the other jobs of its device (None: its share).
    weight: float | None = None


class ComputeDevice:
    """Processor sharing over the jobs running on one device."""

    def __init__(self, name: str, *, isolated: bool = False) -> None:
        self.name = name
        #: No contention at all (the oracle's idealised device): every job runs solo.
        self.isolated = isolated
        self.jobs: dict[str, Job] = {}
        self.last_t = 0.0
        self.version = 0
        self.busy_s = 0.0
        #: The integral of the load (the sum of the running shares) over time.
        self.load_s = 0.0
        #: The compute foreign programs running on the device use (sum of their shares).
        self.foreign_share = 0.0

    @property
    def load(self) -> float:
        return sum(j.share for j in self.jobs.values())

    @property
    def rate(self) -> float:
        """The speed of a job whose share is at most 1, relative to its solo speed."""
        return 1.0 if self.isolated else 1.0 / max(1.0, self.load + self.foreign_share)

    def rate_of(self, job: Job) -> float:
        """A job's speed: the device's :attr:`rate`, times the job's share when that is
        above 1 (a job that keeps more threads runnable than the device has cores runs
        at its solo speed alone, and holds more of the device beside others).

        With contention weights (a job's ``weight``: how much one running request of its
        service slows the others, measured; its share when not), a job runs at
        ``max(1, share) / max(1, share + sum of the others' weights + foreign)``."""
        if self.isolated:
            return 1.0
        if all(j.weight is None for j in self.jobs.values()):
            rate = self.rate
            return rate * job.share if job.share > 1.0 else rate
        others = sum(
            j.share if j.weight is None else j.weight for j in self.jobs.values() if j is not job
        )
        return max(1.0, job.share) / max(1.0, job.share + others + self.foreign_share)

    def set_foreign_share(self, share: float, now: float) -> None:
        """Foreign programs now use ``share`` of the device: the running jobs' speed
        changes from ``now`` on (their next completion moves)."""
        self.advance(now)
        if share != self.foreign_share:
            self.foreign_share = share
            self.version += 1

    def advance(self, now: float) -> None:
        dt = now - self.last_t
        if dt > 0 and self.jobs:
            self.busy_s += dt * min(1.0, self.load)
            self.load_s += dt * self.load
            for job in self.jobs.values():
                rate = self.rate_of(job)
                before = job.done
                job.done += dt * rate
                if job.first_token_at is None and job.prefill > 0 and job.done >= job.prefill:
                    job.first_token_at = self.last_t + (job.prefill - before) / rate
        self.last_t = max(self.last_t, now)

    def add(self, job: Job, now: float) -> None:
        self.advance(now)
        if job.prefill <= 0:
            job.first_token_at = now
        self.jobs[job.rid] = job
        self.version += 1

    def remove(self, rid: str, now: float) -> Job | None:
        self.advance(now)
        job = self.jobs.pop(rid, None)
        if job is not None:
            self.version += 1
        return job

    def next_completion(self) -> float | None:
        if not self.jobs:
            return None
        uniform = all(j.share <= 1.0 and j.weight is None for j in self.jobs.values())
        if uniform or self.isolated:
            left = min(max(0.0, j.work - j.done) for j in self.jobs.values())
            return self.last_t + left / self.rate
        return self.last_t + min(
            max(0.0, j.work - j.done) / self.rate_of(j) for j in self.jobs.values()
        )

    def finished(self, now: float) -> list[Job]:
        """Advance to ``now`` and pop every job whose work is done."""
        self.advance(now)
        done = [j for j in self.jobs.values() if j.work - j.done <= EPS * max(1.0, j.work)]
        for j in sorted(done, key=lambda j: j.rid):
            del self.jobs[j.rid]
            if j.first_token_at is None:
                j.first_token_at = now
        if done:
            self.version += 1
        return done


def solo_work(
    *,
    is_llm: bool,
    base_s: float,
    per_unit_s: float,
    prefill_tps: float,
    tbt_s: float,
    units: float,
    prompt_tokens: int,
    output_tokens: int,
) -> tuple[float, float]:
    """(total work, prefill work) in solo seconds."""
    if is_llm:
        prefill = base_s + prompt_tokens / prefill_tps
        return prefill + output_tokens * tbt_s, max(prefill, EPS)
    work = base_s + per_unit_s * units
    return max(work, EPS), 0.0


def finite(x: float) -> bool:
    return math.isfinite(x)
