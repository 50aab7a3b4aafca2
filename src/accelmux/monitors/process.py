"""Process-tree memory with psutil: PSS when readable, RSS otherwise."""

from __future__ import annotations

import os

import psutil


def process_memory(proc: psutil.Process) -> int:
    """PSS of one process (shared pages split fairly), falling back to RSS."""
    try:
        return int(proc.memory_full_info().pss)
    except (psutil.AccessDenied, AttributeError, OSError):
        return int(proc.memory_info().rss)


def tree(pid: int) -> list[psutil.Process]:
    """The process and all its descendants that still exist."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def tree_pids(pid: int) -> list[int]:
    return [p.pid for p in tree(pid)]


def tree_memory(pid: int) -> int:
    total = 0
    for proc in tree(pid):
        try:
            total += process_memory(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def own_memory() -> int:
    """accelmux's own process (not its children)."""
    return process_memory(psutil.Process(os.getpid()))
