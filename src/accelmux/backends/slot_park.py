"""Pausing and parking the sequences of a llama-server (``park: llama-server``).

A pausable request (:func:`~accelmux.backends.pausable.pausable`) is served through
:class:`~accelmux.backends.pausable.PausableCompletion` in a slot chosen here (``id_slot``:
one that no other running or paused request of this path holds). ``pause`` stops it at
the next clean token boundary; with ``park`` the slot's KV cache is then saved to a file
(``POST /slots/{id}?action=save``) in the directory the server was started with
(``--slot-save-path {slot_save_path}``: ``<data_dir>/slots/<service>``) and the slot is
emptied (``?action=erase``), so it is free for other requests. ``resume`` restores the
file into a free slot (``?action=restore``, the one it left when free), deletes it, and
lets the request go on. A restore that fails (the file or the server gone) is logged and
the request goes on anyway: its prompt is then evaluated again, with the same output.

llama-server allocates its KV cache once, at start: parking frees a slot (its place in
the cache), not device memory. A parked file survives a restart of the server (its
tokens are in it), so a request parked across a cold unload resumes from it.

Timings and sizes of the last save and restore are in ``describe()``.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from accelmux.backends.base import BackendRequest, BackendResponse
from accelmux.backends.llama_slots import LlamaServerClient
from accelmux.backends.pausable import PausableCompletion, Phase, why_not_pausable
from accelmux.backends.process_meter import PeakTracker
from accelmux.errors import BackendError

#: Longest a pause waits for a clean token boundary.
PAUSE_TIMEOUT_S = 60.0
#: Finished requests remembered, so that a late pause or resume of one is no error.
FINISHED_KEPT = 1024
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def slot_dir(data_dir: Path | None, service: str) -> Path:
    """``<data_dir>/slots/<service>`` (a temporary directory without a data dir)."""
    if data_dir is not None:
        return data_dir / "slots" / service
    return Path(tempfile.gettempdir()) / f"accelmux-slots-{_UNSAFE.sub('_', service)}"


class SlotParking:
    """The pausable requests of one llama-server, their slots and their slot files."""

    def __init__(
        self,
        service: str,
        directory: Path,
        *,
        base_url: Callable[[], str],
        session: Callable[[], aiohttp.ClientSession],
        peaks: PeakTracker,
        kv_bytes_per_token: int,
        log: Callable[[str], None],
    ) -> None:
        self.service = service
        self.directory = directory
        self.client = LlamaServerClient(base_url, session)
        self._base_url = base_url
        self._session = session
        self._peaks = peaks
        self._kv_bytes_per_token = kv_bytes_per_token
        self._log = log
        self.slots = 1
        self.requests: dict[str, PausableCompletion] = {}
        self._finished: deque[str] = deque(maxlen=FINISHED_KEPT)
        self._unpausable: OrderedDict[str, str] = OrderedDict()  # in flight elsewhere: why
        self._files = 0
        self.stats: dict[str, Any] = {
            "pauses": 0,
            "saves": 0,
            "restores": 0,
            "resumes": 0,
            "held_back_boundaries": 0,
        }

    # ---- lifecycle --------------------------------------------------------------------
    def prepare(self, *, first: bool) -> None:
        """Make the directory; at the first start, remove what an earlier run left."""
        self.directory.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.directory.mkdir(exist_ok=True, mode=0o700)
        if first:
            for leftover in self.directory.glob("*.bin"):
                with contextlib.suppress(OSError):
                    leftover.unlink()

    async def learn_slots(self) -> None:
        """How many slots the server runs (``GET /slots``; 1 when it does not say)."""
        try:
            self.slots = max(1, len(await self.client.slots()))
        except BackendError as exc:
            self.slots = 1
            self._log(f"accelmux: cannot list the server's slots ({exc}); pausing in slot 0")

    def close(self) -> None:
        for pc in list(self.requests.values()):
            self._drop_file(pc)
            pc.abort(f"{self.service}: the backend closed while {pc.request_id} was {pc.phase}")

    # ---- requests ---------------------------------------------------------------------
    def handles(self, request: BackendRequest) -> bool:
        """Whether this path serves ``request``; if not, it is remembered (while it runs)
        as one that cannot be paused, and why."""
        why = why_not_pausable(request)
        if why is None:
            return True
        self._unpausable[request.request_id] = why
        while len(self._unpausable) > FINISHED_KEPT:
            self._unpausable.popitem(last=False)
        return False

    def unpausable_ended(self, request_id: str) -> None:
        self._unpausable.pop(request_id, None)

    async def start(self, request: BackendRequest) -> BackendResponse:
        pc = PausableCompletion(
            request,
            client=self.client,
            session=self._session,
            base_url=self._base_url,
            slot=self._free_slot(prefer=None),
            peaks=self._peaks,
            kv_bytes_per_token=self._kv_bytes_per_token,
            on_end=self._ended,
        )
        self.requests[pc.request_id] = pc
        return await pc.open()

    def _ended(self, pc: PausableCompletion) -> None:
        self._drop_file(pc)
        self.stats["held_back_boundaries"] += pc.held_back
        timings = pc.last_segment_timings
        if pc.segments > 1 and timings:
            self.stats["last_resumed"] = {
                "segments": pc.segments,
                "prompt_cached": timings.get("cache_n"),
                "prompt_evaluated": timings.get("prompt_n"),
            }
        if self.requests.get(pc.request_id) is pc:
            del self.requests[pc.request_id]
        self._finished.append(pc.request_id)

    def _free_slot(self, prefer: int | None) -> int:
        """A slot no running or paused (unparked) request of this path holds; else the
        slot of a paused one (its KV may be overwritten: it recomputes); else slot 0."""
        held = {pc.slot for pc in self.requests.values() if pc.parked is None}
        if prefer is not None and prefer < self.slots and prefer not in held:
            return prefer
        free = [slot for slot in range(self.slots) if slot not in held]
        if free:
            return free[0]
        paused = [pc.slot for pc in self.requests.values() if pc.phase is Phase.PAUSED]
        return paused[0] if paused else 0

    # ---- pause and resume ---------------------------------------------------------------
    async def pause(self, request_id: str, *, park: bool) -> None:
        pc = self.requests.get(request_id)
        if pc is None:
            why = self._unpausable.get(request_id)
            if why is not None:
                raise BackendError(f"{self.service}: {request_id} cannot be paused: {why}")
            return  # unknown or finished: nothing runs to pause
        if not await pc.pause(PAUSE_TIMEOUT_S):
            return  # it ended before a boundary came
        self.stats["pauses"] += 1
        if park and pc.parked is None:
            await self._park(pc)

    async def _park(self, pc: PausableCompletion) -> None:
        self._files += 1
        name = f"{_UNSAFE.sub('_', pc.request_id)[:80]}-{self._files}.bin"
        started = time.monotonic()
        try:
            await self.client.wait_idle(pc.slot)
            answer = await self.client.save(pc.slot, name)
            await self.client.erase(pc.slot)
        except BackendError as exc:
            self._drop_name(name)
            # Refused as a whole: the stream goes on (the Manager still counts it running).
            pc.resume()
            raise BackendError(
                f"{self.service}: {pc.request_id} was not parked (its slot {pc.slot} was not "
                f"saved: {exc}); it goes on"
            ) from None
        pc.parked = name
        self.stats["saves"] += 1
        self.stats["last_save"] = {
            "seconds": round(time.monotonic() - started, 4),
            "tokens": answer.get("n_saved"),
            "bytes": answer.get("n_written"),
            "server_ms": (answer.get("timings") or {}).get("save_ms"),
        }

    async def resume(self, request_id: str) -> None:
        pc = self.requests.get(request_id)
        if pc is None:
            if request_id in self._finished:
                return
            raise BackendError(f"{self.service}: no paused request {request_id!r} to resume")
        if pc.phase is not Phase.PAUSED:
            return  # running (or ending): nothing to do
        if pc.parked is not None:
            await self._unpark(pc)
        self.stats["resumes"] += 1
        pc.resume()

    async def _unpark(self, pc: PausableCompletion) -> None:
        slot = self._free_slot(prefer=pc.slot)
        started = time.monotonic()
        try:
            answer = await self.client.restore(slot, pc.parked or "")
        except BackendError as exc:
            self._log(
                f"accelmux: restoring the slot of {pc.request_id} failed ({exc}); "
                "it resumes by evaluating its prompt again"
            )
        else:
            self.stats["restores"] += 1
            self.stats["last_restore"] = {
                "seconds": round(time.monotonic() - started, 4),
                "tokens": answer.get("n_restored"),
                "bytes": answer.get("n_read"),
                "server_ms": (answer.get("timings") or {}).get("restore_ms"),
            }
        self._drop_file(pc)
        pc.slot = slot

    # ---- files and status -----------------------------------------------------------
    def _drop_file(self, pc: PausableCompletion) -> None:
        if pc.parked is not None:
            self._drop_name(pc.parked)
            pc.parked = None

    def _drop_name(self, name: str) -> None:
        with contextlib.suppress(OSError):
            (self.directory / name).unlink()

    def describe(self) -> dict[str, Any]:
        phases = [pc.phase for pc in self.requests.values()]
        return {
            "slot_save_path": str(self.directory),
            "slots": self.slots,
            "running": phases.count(Phase.RUNNING),
            "paused": phases.count(Phase.PAUSED),
            "parked": sum(pc.parked is not None for pc in self.requests.values()),
            **self.stats,
        }
