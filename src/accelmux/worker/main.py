"""The inference worker process: ``python -m accelmux.worker.main --fd N --data-dir D``.

It reads frames from the socket ``N`` (see :mod:`accelmux.worker.protocol`) on its main
thread and runs every model call on the thread of the component it concerns, so a long
generation never delays a load, a cancel or a memory report. Replies are written under
one lock. Components are shared by key and refcounted: the first service to load a
model file loads it, later ones only take a reference, and the last to let go unloads
it. A streamed request can pause between chunks and resume (:mod:`accelmux.worker.streams`):
while it is paused its component's thread serves other requests. A component whose
service unloads while some of its streams are paused keeps them (``resting``: their
saved state in host memory) and serves them again when a service loads the same model.
The worker exits when the daemon closes the socket.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import gc
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from accelmux.core.types import ServiceKind
from accelmux.errors import BackendError, RequestError
from accelmux.models.offload import own_gpu_bytes
from accelmux.worker import protocol
from accelmux.worker.component_base import Component, Slot, rss_bytes
from accelmux.worker.components import component_key, make_component
from accelmux.worker.cuda_context import open_gpu
from accelmux.worker.gpu_account import GpuAccount
from accelmux.worker.parked import ParkedWeights
from accelmux.worker.peaks import PeakSampler
from accelmux.worker.streams import RunState, StreamRun, Streams


def _trim() -> None:
    """Give freed heap pages back to the system (glibc keeps them otherwise)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def pss_bytes() -> int:
    try:
        with open("/proc/self/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return rss_bytes()


class Held:
    """A loaded component, its thread, and the services holding it (first = owner)."""

    def __init__(self, component: Component) -> None:
        self.component = component
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=component.ctype)
        self.slots: list[Slot] = []

    def run(self, func: Callable[[], Any]) -> Any:
        return self.pool.submit(func).result()


class Worker:
    def __init__(self, sock: socket.socket, data_dir: Path) -> None:
        self.sock = sock
        self.data_dir = data_dir
        self.send_lock = threading.Lock()
        self.held: dict[str, Held] = {}  # component key -> held
        self.slots: dict[str, tuple[Slot, Held]] = {}  # service -> its slot
        self.control = ThreadPoolExecutor(max_workers=1, thread_name_prefix="control")
        self.cancels: dict[int, threading.Event] = {}
        self.active: dict[int, tuple[str, int]] = {}  # request id -> (service, sampler token)
        self.sampler = PeakSampler()
        self.base_rss = rss_bytes()
        self.streams = Streams(self)
        self.parked = ParkedWeights()
        #: unloaded components that keep paused streams, by key (reused by the next load)
        self.resting: dict[str, Component] = {}
        #: its GPU overhead and the growth requests leave (gpu_account)
        self.gpu = GpuAccount(own_gpu_bytes, open_gpu)
        #: request id -> the component on a GPU it runs on, while it runs
        self.on_gpu: dict[int, Component] = {}

    # -- wire -------------------------------------------------------------------------
    def send(self, header: dict[str, Any], blob: bytes = b"") -> None:
        frame = protocol.encode(header, blob)
        with self.send_lock:
            self.sock.sendall(frame)

    def reply_error(self, rid: int, exc: BaseException) -> None:
        if isinstance(exc, RequestError):
            self.send(
                {
                    "id": rid,
                    "type": "error",
                    "error_type": "request",
                    "error": str(exc),
                    "status": exc.status,
                    "field": exc.field,
                }
            )
        else:
            message = str(exc) if isinstance(exc, BackendError) else f"{type(exc).__name__}: {exc}"
            self.send({"id": rid, "type": "error", "error_type": "backend", "error": message})

    def run(self) -> None:
        self.send({"id": 0, "type": "hello", "pid": os.getpid()})
        while True:
            try:
                header, blob = protocol.recv_frame(self.sock)
            except (EOFError, OSError):
                return
            self.dispatch(header, blob)

    def dispatch(self, header: dict[str, Any], blob: bytes) -> None:
        rid = int(header.get("id", 0))
        op = header.get("op")
        if op == "memory":
            self.send({"id": rid, "type": "ok", **self.memory()})
        elif op == "cancel":
            target = int(header.get("target", -1))
            event = self.cancels.get(target)
            if event is not None:
                event.set()
            self.streams.cancel(target)
            self.control.submit(self._prune_resting)  # a resting model may keep no more
        elif op == "pause":
            self.streams.op_pause(rid, header)
        elif op == "resume":
            self.streams.op_resume(rid, header)
        elif op in ("load", "unload"):
            self.control.submit(self._lifecycle, rid, getattr(self, f"op_{op}"), header)
        elif op == "resize":
            # straight onto the model's thread, in arrival order: a request sent after a
            # grow must find the bigger context
            entry = self.slots.get(str(header.get("service")))
            if entry is None:
                self.send({"id": rid, "type": "ok", "applied": False})
            else:
                entry[1].pool.submit(self._guarded, rid, self.op_resize, header)
        elif op == "infer":
            self.op_infer(rid, header, blob)
        else:
            self.send({"id": rid, "type": "error", "error_type": "backend", "error": f"op {op}"})

    def _lifecycle(
        self, rid: int, func: Callable[[dict[str, Any]], dict[str, Any]], h: Any
    ) -> None:
        """A load or unload: what it moves in the process's RSS is kept out of the peaks
        of the requests running meanwhile (see :mod:`accelmux.worker.peaks`)."""
        self.sampler.hold()
        try:
            self._guarded(rid, func, h)
        finally:
            self.sampler.release()

    def _guarded(self, rid: int, func: Callable[[dict[str, Any]], dict[str, Any]], h: Any) -> None:
        try:
            result = func(h)
        except BaseException as exc:
            if not isinstance(exc, (BackendError, RequestError)):
                traceback.print_exc(file=sys.stderr)
            self.reply_error(rid, exc)
            return
        self.send({"id": rid, "type": "ok", **result})

    # -- lifecycle ops (on the control thread; model calls on the component's thread) -----
    def op_load(self, h: dict[str, Any]) -> dict[str, Any]:
        service = str(h["service"])
        if service in self.slots:
            self.op_unload({"service": service})
        kind = ServiceKind(str(h["kind"]))
        options = dict(h.get("options") or {})
        model_path = h.get("model_path")
        slot = Slot(service, kind, options, kv_pool_bytes=int(h.get("kv_pool_bytes", 0)))
        gpu = h.get("gpu_index")
        device = str(h.get("device") or (f"gpu{gpu}" if gpu is not None else "cpu"))
        key = component_key(kind, options, model_path, device)
        self._end_elsewhere(service, key)
        held = self.held.get(key)
        shared = held is not None
        kept = 0
        if held is None:
            component = self.resting.pop(key, None)  # its paused streams continue
            if component is None:
                component = make_component(
                    kind,
                    options,
                    model_path,
                    self.data_dir,
                    None if gpu is None else int(gpu),
                    device,
                )
                component.gpu_account = self.gpu
            kept = component.kept_streams()
            held = Held(component)
            try:
                held.run(lambda: component.load(slot))
            except BaseException:
                held.pool.shutdown(wait=False)
                if component.kept_streams():
                    self.resting[key] = component  # they wait for a load that works
                _trim()
                raise
            self.held[key] = held
        held.slots.append(slot)
        self.slots[service] = (slot, held)
        kept = max(0, kept - self._end_unkept())  # the file changed since: they end
        if shared:
            held.run(lambda: held.component.resize(held.slots))
        c = held.component
        weights = c.weights_file()
        from_parked = weights is not None and self.parked.holds(weights)
        self.parked.release(service)  # loaded again: its mapping has done its work
        return {
            "from_parked": from_parked,
            "key": key,
            "shared": shared,
            "paused_kept": kept,
            "owner": held.slots[0].service,
            "weights_bytes": 0 if shared else c.weights_bytes,
            "runtime_bytes": 0 if shared else c.runtime_bytes,
            "kv_bytes": c.kv_bytes(),
            "load_rss_bytes": 0 if shared else c.load_rss_bytes,
            "load_seconds": round(c.load_seconds, 4),
            "base_bytes": self.base_rss,
            "accelerator": c.accelerator,
            "accelerator_fix": c.placement.fix,
            "gpu_bytes": 0 if shared else c.gpu_bytes_now(),
        }

    def op_unload(self, h: dict[str, Any]) -> dict[str, Any]:
        """Tier ``parked``: the model file stays mapped in RAM for the service (when it
        was the last to hold it); ``cold`` also drops what it had parked. Either way the
        service's paused streams stay paused (their state in host memory) for its next
        load, except those its component cannot keep; ``end_paused`` (the service
        stops) ends them all."""
        service = str(h["service"])
        park = str(h.get("tier") or "cold") == "parked"
        entry = self.slots.pop(service, None)
        if h.get("end_paused"):
            why = BackendError(f"{service} stopped while this request was paused")
            for run in self.streams.paused_of(service):
                drop = functools.partial(self.streams.drop, run, why)
                if entry is not None:
                    entry[1].run(drop)  # on the model's thread while it is loaded
                else:
                    drop()
            self._prune_resting()
        if entry is None:
            if park:
                return {"unloaded": False, "parked": service in self.parked.services()}
            return {"unloaded": False, "parked": False, "released": self.parked.release(service)}
        slot, held = entry
        held.run(lambda: held.component.release(slot))
        held.slots.remove(slot)
        paused = len(self.streams.paused_of(service))
        if held.slots:  # its weights stay loaded for the others: nothing to park
            held.run(lambda: held.component.resize(held.slots))
            others = [s.service for s in held.slots]
            return {
                "unloaded": True,
                "still_held_by": others,
                "parked": False,
                "paused_kept": paused,
            }
        component = held.component
        del self.held[component.key]
        weights = component.weights_file() if park else None
        parked: dict[str, Any] = {"parked": False}
        if weights is not None:  # mapped before the model lets go: its pages stay
            try:
                kept = self.parked.park(weights, service)
                parked = {"parked": True, "park_seconds": round(kept.seconds, 4)}
            except OSError as exc:
                print(f"parking {weights} failed: {exc}", file=sys.stderr)
        started = time.perf_counter()
        held.run(component.unload)  # paused llama.cpp sequences are saved first
        held.pool.shutdown(wait=True)
        if component.kept_streams():
            self.resting[component.key] = component
        ended = self._end_unkept()
        _trim()
        return {
            "unloaded": True,
            "still_held_by": [],
            **parked,
            "paused_kept": paused - ended,
            "paused_ended": ended,
            "unload_seconds": round(time.perf_counter() - started, 4),
        }

    def _end_unkept(self) -> int:
        """End the paused runs whose sequence their component did not keep (over an
        unload, or a load of a changed file), with the reason the sequence gives.
        Returns how many."""
        ended = 0
        for run in self.streams.runs.of_all():
            sequence = run.control.sequence
            if run.state is RunState.PAUSED and sequence is not None and sequence.state == "ended":
                why = sequence.why or f"{run.service} was unloaded while this request was paused"
                self.streams.drop(run, BackendError(why))
                ended += 1
        return ended

    def _end_elsewhere(self, service: str, key: str) -> None:
        """``service`` loads component ``key``: its paused runs kept by another (resting)
        component cannot continue there."""
        for run in self.streams.paused_of(service):
            if run.component and run.component != key and run.chunks is not None:
                why = f"{service} now loads another model; its paused request cannot continue"
                self.streams.drop(run, BackendError(why))
        self._prune_resting()

    def _prune_resting(self) -> None:
        """Let go of resting components that no longer keep a paused stream."""
        for key, component in list(self.resting.items()):
            if not component.kept_streams():
                del self.resting[key]
                component.discard("its model is gone")

    def op_resize(self, h: dict[str, Any]) -> dict[str, Any]:
        entry = self.slots.get(str(h["service"]))
        if entry is None:
            return {"applied": False}
        slot, held = entry  # runs on the component's own thread
        slot.kv_pool_bytes = int(h.get("kv_pool_bytes", 0))
        applied = bool(held.component.resize(held.slots))
        return {"applied": applied, "kv_bytes": held.component.kv_bytes()}

    # -- requests ------------------------------------------------------------------------
    def op_infer(self, rid: int, h: dict[str, Any], blob: bytes) -> None:
        entry = self.slots.get(str(h.get("service")))
        if entry is None:
            self.send(
                {"id": rid, "type": "error", "error_type": "crashed", "error": "not loaded here"}
            )
            return
        slot, held = entry
        endpoint = str(h.get("endpoint"))
        body = h.get("body") or {}
        request_id = str(h.get("request_id") or "")
        if h.get("stream"):
            run = StreamRun(rid, slot.service, request_id, endpoint, body, held.component.key)
            self.cancels[rid] = run.control.cancelled
            self.streams.start(run, paused=bool(h.get("paused")))
            return
        files = protocol.unpack_files(h.get("files"), blob)
        key = (slot.service, request_id)
        self.cancels[rid] = threading.Event()
        self.streams.runs.add_call(key, rid)

        def work() -> None:
            self.begin_request(rid, slot.service)
            try:
                status, ctype, data, kv = held.component.infer(slot, endpoint, body, files)
            except BaseException as exc:
                self.end_request(rid)
                if not isinstance(exc, (BackendError, RequestError)):
                    traceback.print_exc(file=sys.stderr)
                self.reply_error(rid, exc)
                return
            finally:
                self.cancels.pop(rid, None)
                self.streams.runs.end(rid, key)
            peak = self.end_request(rid) + kv
            self.send(
                {
                    "id": rid,
                    "type": "ok",
                    "status": status,
                    "content_type": ctype,
                    "peak_bytes": peak,
                },
                data,
            )

        future: Future[None] = held.pool.submit(work)
        del future

    # -- what the streams need (streams.Host) -------------------------------------------
    def begin_request(self, rid: int, service: str) -> None:
        self.active[rid] = (service, self.sampler.begin())
        self._gpu_begin(rid, service)

    def end_request(self, rid: int) -> int:
        self.cancels.pop(rid, None)
        self._gpu_end(rid)
        entry = self.active.pop(rid, None)
        return self.sampler.end(entry[1]) if entry is not None else 0

    def suspend_request(self, rid: int) -> None:
        entry = self.active.get(rid)
        if entry is not None:
            self.sampler.suspend(entry[1])
            self._gpu_end(rid)  # a paused request runs nothing on its GPU

    def resume_request(self, rid: int) -> None:
        entry = self.active.get(rid)
        if entry is not None:
            self.sampler.resume(entry[1])
            self._gpu_begin(rid, entry[0])

    def _gpu_begin(self, rid: int, service: str) -> None:
        entry = self.slots.get(service)
        if entry is None or rid in self.on_gpu:
            return
        component = entry[1].component
        if component.gpu_index_now() is not None:
            self.on_gpu[rid] = component
            self.gpu.begin(component)

    def _gpu_end(self, rid: int) -> None:
        """When it was the last request on its GPU, the growth is settled (gpu_account)."""
        component = self.on_gpu.pop(rid, None)
        if component is not None:
            self.gpu.end(component, lambda: [h.component for h in list(self.held.values())])

    def component_of(self, service: str) -> tuple[Slot, Component, Executor] | None:
        entry = self.slots.get(service)
        if entry is None:
            return None
        slot, held = entry
        return slot, held.component, held.pool

    # -- memory --------------------------------------------------------------------------
    def memory(self) -> dict[str, Any]:
        """Per service: weights, runtime, kv, active (owners carry shared components)."""
        services: dict[str, dict[str, Any]] = {}
        active: dict[str, int] = {}
        running: dict[str, int] = {}
        for service, token in list(self.active.values()):
            active[service] = active.get(service, 0) + self.sampler.current(token)
            running[service] = running.get(service, 0) + 1
        for service, (slot, held) in self.slots.items():
            c = held.component
            owner = held.slots[0] is slot
            services[service] = {
                "component": c.key,
                "owner": owner,
                "shared_with": [s.service for s in held.slots if s is not slot],
                "weights": c.weights_bytes if owner else 0,
                "runtime": c.runtime_bytes if owner else 0,
                "kv": c.kv_bytes() if owner else 0,
                "active": active.get(service, 0),
                "gpu": c.gpu_bytes_now() if owner else 0,
                "gpu_growth": c.gpu_growth if owner else 0,
                "accelerator": c.accelerator,
                "batch_size": running.get(service, 0),
                **c.live(),
                **self.streams.report(service),
            }
        # paused requests of services not loaded now: what they parked is host memory
        kept: dict[str, dict[str, int]] = {}
        for service in {r.service for r in self.streams.runs.of_all()} - set(services):
            report = self.streams.report(service)
            if report["paused"]:
                kept[service] = report
        return {
            "pid": os.getpid(),
            "rss_bytes": rss_bytes(),
            "pss_bytes": pss_bytes(),
            "base_bytes": self.base_rss,
            "services": services,
            "parked_streams": kept,
            "parked_streams_bytes": sum(r["parked_kv"] for r in kept.values()),
            "gpu_overhead": self.gpu.report(),
            **self.parked.report(loaded=self._loaded_files()),
        }

    def _loaded_files(self) -> set[Path]:
        files = (held.component.weights_file() for held in list(self.held.values()))
        return {f.resolve() for f in files if f is not None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="accelmux-worker")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--data-dir", default=".")
    args = parser.parse_args(argv)
    # The daemon owns the lifecycle: Ctrl-C in the terminal goes to the daemon, which
    # stops the worker by closing the socket.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=args.fd)
    worker = Worker(sock, Path(args.data_dir))
    try:
        worker.run()
    finally:
        sock.close()
    os._exit(0)  # do not wait for model threads still running: the daemon is gone


if __name__ == "__main__":
    sys.exit(main())
