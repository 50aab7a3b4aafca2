"""Parked weights: model files a worker keeps in host RAM for services it unloaded.

``unload(tier=parked)`` of a llama.cpp service maps its GGUF file read-only
(``MAP_POPULATE``: the kernel reads the whole file in while mapping it) and advises
``MADV_WILLNEED``, *before* the model is freed: llama.cpp memory-maps its weights, so
their pages are the same page-cache pages and never leave RAM. The next load of the file
(``llama_model_load_from_file``, mmap again) finds them resident and copies nothing from
disk. The mapping goes when the service loads again or unloads cold.

A mapping keeps pages resident only as long as the kernel has no better use for them (no
``mlock``: an unprivileged process may lock a few MiB at most); the report says how many
bytes are resident now (``mincore``), and that is what the worker reports as parked.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PAGE = mmap.PAGESIZE
MAP_FAILED = ctypes.c_void_p(-1).value


def _libc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


_LIBC = _libc()


class Mapping:
    """A read-only shared mapping of a whole file, by address (libc ``mmap``, so that
    ``mincore`` can say what is resident); Python's ``mmap`` where libc is not there.
    ``populate``: read the whole file in (``MAP_POPULATE``, ``MADV_WILLNEED``); without
    it the mapping only looks (how much of the file is in the page cache)."""

    def __init__(self, path: Path, *, populate: bool = True) -> None:
        self.size = path.stat().st_size
        self._addr: int | None = None
        self._fallback: mmap.mmap | None = None
        fd = os.open(path, os.O_RDONLY)
        try:
            flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
            if _LIBC is not None and self.size:
                addr = _LIBC.mmap(None, self.size, mmap.PROT_READ, flags, fd, 0)
                if addr is None or addr == MAP_FAILED:
                    raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
                self._addr = int(addr)
                if populate:
                    _LIBC.madvise(self._addr, self.size, getattr(mmap, "MADV_WILLNEED", 3))
            elif self.size:
                self._fallback = mmap.mmap(fd, 0, flags=flags, prot=mmap.PROT_READ)
        finally:
            os.close(fd)

    def resident_bytes(self) -> int:
        """Bytes of the file in RAM now (its size when that cannot be read)."""
        if self._addr is None or _LIBC is None:
            return self.size
        pages = (self.size + PAGE - 1) // PAGE
        vec = (ctypes.c_ubyte * pages)()
        if _LIBC.mincore(self._addr, self.size, vec) != 0:
            return self.size
        resident = pages - bytes(vec).count(0)  # mincore sets bit 0 of a resident page
        return min(self.size, resident * PAGE)

    def close(self) -> None:
        if self._addr is not None and _LIBC is not None:
            _LIBC.munmap(self._addr, self.size)
            self._addr = None
        if self._fallback is not None:
            with contextlib.suppress(BufferError, ValueError):
                self._fallback.close()
            self._fallback = None


@dataclass
class ParkedFile:
    """One model file held in host RAM, and the services that parked it."""

    path: Path
    mapping: Mapping
    seconds: float  # how long mapping and reading it through took
    services: set[str] = field(default_factory=set)


class ParkedWeights:
    """The files parked in one worker, by resolved path."""

    def __init__(self) -> None:
        self.files: dict[Path, ParkedFile] = {}

    def park(self, path: Path, service: str) -> ParkedFile:
        """Hold ``path`` in RAM for ``service`` (mapped and read through once)."""
        key = path.resolve()
        held = self.files.get(key)
        if held is None:
            started = time.perf_counter()
            held = ParkedFile(key, Mapping(key), time.perf_counter() - started)
            self.files[key] = held
        held.services.add(service)
        return held

    def holds(self, path: Path) -> bool:
        return path.resolve() in self.files

    def release(self, service: str) -> bool:
        """``service`` loads again or unloads cold: its files go when nobody else parks
        them. True when it had parked something."""
        had = False
        for key, held in list(self.files.items()):
            if service in held.services:
                had = True
                held.services.discard(service)
                if not held.services:
                    del self.files[key]
                    held.mapping.close()
        return had

    def services(self) -> set[str]:
        return {s for held in self.files.values() for s in held.services}

    def report(self, loaded: set[Path] | None = None) -> dict[str, Any]:
        """``parked``: bytes per service (a file parked by several is split),
        ``parked_bytes``: resident bytes in all, ``parked_files``: each file. A file a
        loaded model maps too (in ``loaded``) counts as that model's weights, not here."""
        per_service: dict[str, int] = {}
        files = []
        total = 0
        for held in self.files.values():
            resident = held.mapping.resident_bytes()
            also_loaded = held.path in (loaded or set())
            files.append(
                {
                    "path": str(held.path),
                    "bytes": held.mapping.size,
                    "resident_bytes": resident,
                    "services": sorted(held.services),
                    "park_seconds": round(held.seconds, 4),
                    "loaded": also_loaded,
                }
            )
            if also_loaded:
                continue
            total += resident
            for service in held.services:
                share = resident // len(held.services)
                per_service[service] = per_service.get(service, 0) + share
        return {"parked": per_service, "parked_bytes": total, "parked_files": files}
