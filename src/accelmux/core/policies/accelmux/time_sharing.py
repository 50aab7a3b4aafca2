"""Time sharing between models and yielding compute to realtime work: pausing streams for
another model's first token (``time_share``, ``first_token_pause``), pausing interactive
streams while realtime work runs on their device (``realtime_yield``), and what a round
must know of both.
"""

from __future__ import annotations

from accelmux.core.policies.accelmux import facts
from accelmux.core.policies.accelmux.cache import Miss
from accelmux.core.policies.accelmux.heuristics import TUNING
from accelmux.core.policies.accelmux.records import Seam
from accelmux.core.types import Reason
from accelmux.core.world import RequestState, ServiceState


class TimeSharing:
    """Pausing streams between tokens for another model's first token or for realtime
    work, and what the rest of the round must know of the pauses it asked for."""

    def __init__(self, seam: Seam) -> None:
        self.view = seam.view
        self.ops = seam.ops
        self.cache = seam.cache
        #: Requests paused to switch models -> the request they were paused for: they
        #: do not take back the memory they gave until it has started.
        self.yielded_to: dict[str, str] = {}
        #: Requests paused to give the compute to realtime work (realtime_yield).
        self.yielded_realtime: set[str] = set()

    def forget_settled(self) -> None:
        """Forget the pauses that are over: requests resumed, ended, or no longer paused
        nor pausing."""
        view = self.view
        if self.yielded_to:
            self.yielded_to = {
                r: o
                for r, o in self.yielded_to.items()
                if r in view.waiting or facts.pausing(view, r)
            }
        if self.yielded_realtime:
            self.yielded_realtime = {
                r
                for r in self.yielded_realtime
                if ((q := view.waiting.get(r)) and q.paused) or facts.pausing(view, r)
            }

    def note_yield(self, req: RequestState, requester: RequestState) -> None:
        """``req`` was paused so that ``requester``'s model can load."""
        self.yielded_to[req.request_id] = requester.request_id

    def pause_for_first_token(self, svc: ServiceState, req: RequestState) -> bool:
        """A new request of a service at its concurrency limit pauses the stream of that
        service that has run longest (at least ``TIME_SHARE_MIN_RUN_S``, below the
        pause bound): it gets its first token now, the paused stream resumes at the
        next free slot. Its KV state is parked only when the pool must make room."""
        if (
            req.paused
            or not self.view.knobs.switches.first_token_pause
            or not facts.can_pause(self.view, svc)
        ):
            return False
        if not svc.spec.kind.is_llm:
            return False
        ran = [
            r
            for r in svc.inflight.values()
            if r.running_since is not None
            and self.view.now - r.running_since >= TUNING.time_share_min_run_s
            and r.pauses < TUNING.max_pauses
            and r.pausable
            and r.pausing is None
        ]
        if not ran:
            return False
        victim = min(ran, key=lambda r: (r.running_since or 0.0, r.seq))
        park = svc.kv_in_use + req.estimate.kv_bytes > svc.kv_usable
        return self.ops.pause(
            victim, reason=Reason.TIME_SHARE, park=park, detail=f"first token of {req.request_id}"
        )

    def yielding(self, req: RequestState) -> bool:
        """Whether paused ``req`` still leaves its memory to the request it was paused
        for: until that one has started (or ended)."""
        other = self.yielded_to.get(req.request_id)
        if other is None:
            return False
        waiting = self.view.waiting.get(other)
        if waiting is not None and not waiting.paused:
            return True
        del self.yielded_to[req.request_id]
        return False

    def room_key(self, device: str, requester: RequestState | None) -> object:
        """:meth:`facts.sharing_key`, or None where no service of ``device`` can be paused for
        time sharing (then no requester's state changes what make_room can free)."""
        if device not in self.time_sharing_devices():
            return None
        return facts.sharing_key(self.view, requester)

    def time_sharing_devices(self) -> frozenset[str]:
        """Devices with an LLM service whose backend can pause (what the spec and the
        knobs declare: found once per spec)."""
        kept = self.cache.sharing_devices.get(None, None)
        if kept is not Miss.MISS:
            return kept
        found = frozenset(
            s.spec.device
            for s in self.view.services.values()
            if s.spec.kind.is_llm and facts.can_pause(self.view, s)
        )
        return self.cache.sharing_devices.put(None, None, found)

    def round_realtime_devices(self) -> set[str]:
        """:meth:`facts.realtime_devices`, found once per round: the yield to realtime work and
        the schedule both ask, and nothing between them starts, ends or queues realtime
        work (they pause, preempt, evict and load only lower-class or idle services)."""
        kept = self.cache.realtime_devices.get(None, None)
        if kept is not Miss.MISS:
            return kept
        return self.cache.realtime_devices.put(None, None, facts.realtime_devices(self.view))

    def yield_to_realtime(self) -> None:
        """Pause the running streams of interactive LLMs on devices with realtime work."""
        devices = self.round_realtime_devices()
        if not devices:
            return
        for svc in list(self.view.busy):
            if svc.spec.device not in devices or not facts.yields_compute(self.view, svc):
                continue
            shared_cores = facts.compute_is_shared(self.view, svc.spec.device)
            for req in list(svc.inflight.values()):
                since = req.running_since if req.running_since is not None else self.view.now
                if not shared_cores and self.view.now - since < TUNING.time_share_min_run_s:
                    continue  # its first token comes first
                # Parked (when it can be): its model may then be evicted if the realtime
                # work needs the memory, instead of a paused stream pinning it.
                if self.ops.pause(
                    req,
                    reason=Reason.TIME_SHARE,
                    park=svc.spec.capabilities.park,
                    detail="realtime work running",
                    for_realtime=True,
                ):
                    self.yielded_realtime.add(req.request_id)
