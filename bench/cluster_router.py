"""The pure cluster router at scale (part of ``bench/bench_cluster.py``): decisions per
second of the scan (:func:`accelmux.core.routing.route`) and of the indexed route the
gateway uses, over synthetic views of the default stack's 8 services on every node, and
what one poll costs the gateway (snapshots to views, then the index)."""

from __future__ import annotations

import json
import random
import time
from typing import Any

from accelmux.cluster.snapshots import view_of
from accelmux.core.routing import NodeView, build_index, route, route_indexed

ROUTER_SCALES = (1, 2, 4, 10, 100, 1000)


def synthetic_snapshots(count: int, rnd: random.Random) -> list[dict[str, Any]]:
    """``count`` nodes as their daemons report them: the default stack's 8 services on
    each, in varied states, classes and loads."""
    kinds = ["chat", "completion", "embeddings", "image", "asr", "tts", "detect", "chat"]
    states = ["loaded", "loaded", "loaded", "unloaded", "loading"]
    classes = ["realtime", "interactive", "batch", "background"]
    out = []
    for i in range(count):
        services = []
        for j, kind in enumerate(kinds):
            services.append(
                {
                    "service": f"svc{j}",
                    "kind": kind,
                    "class": rnd.choice(classes),
                    "models": [f"svc{j}", f"alias{j}"],
                    "state": rnd.choice(states),
                    "pinned": rnd.random() < 0.2,
                    "inflight": rnd.randint(0, 2),
                    "waiting": rnd.randint(0, 3),
                    "concurrency": 2,
                    "device": "gpu",
                    "load_bytes": rnd.randint(64, 4096) * 2**20,
                    "held_bytes": rnd.randint(0, 4096) * 2**20,
                    "load_s": round(rnd.uniform(0.1, 20), 3),
                    "backing_off": False,
                }
            )
        out.append(
            {
                "node": f"n{i:04d}",
                "devices": {
                    "gpu": {
                        "budget_bytes": 24 * 2**30,
                        "available_bytes": rnd.randint(0, 24) * 2**30,
                    }
                },
                "services": services,
            }
        )
    return out


def _rate(seconds: float, step: Any) -> float:
    """Calls of ``step`` per second over about ``seconds`` (at least 3 calls)."""
    calls = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds or calls < 3:
        step()
        calls += 1
    return calls / (time.perf_counter() - started)


def router_row(count: int, snaps: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    models = [f"svc{j}" for j in range(8)]
    views: list[NodeView] = [view_of(s, alive=True) for s in snaps]
    index = build_index(views)
    pending = {(f"n{i:04d}", "svc0"): 1 for i in range(0, count, 3)}
    view_rate = _rate(seconds / 4, lambda: [view_of(s, alive=True) for s in snaps])
    index_rate = _rate(seconds / 4, lambda: build_index(views))
    scan = _rate(seconds / 4, lambda: [route(views, m, pending) for m in models])
    indexed = _rate(seconds / 4, lambda: [route_indexed(index, m, pending) for m in models])
    return {
        "nodes": count,
        "scan_decisions_per_s": round(scan * len(models)),
        "indexed_decisions_per_s": round(indexed * len(models)),
        "views_per_poll_s": round(1 / view_rate, 6),
        "index_per_poll_s": round(1 / index_rate, 6),
        "snapshot_bytes": len(json.dumps(snaps[0]).encode()),
    }


def bench_router(seconds: float, seed: int = 1) -> list[dict[str, Any]]:
    """Per scale: decisions/s of the scan and of the indexed route, and what one poll
    costs the gateway (snapshots -> views -> index)."""
    rnd = random.Random(seed)
    rows = []
    for count in ROUTER_SCALES:
        row = router_row(count, synthetic_snapshots(count, rnd), seconds)
        rows.append(row)
        print(
            f"router {count:>5} nodes: scan {row['scan_decisions_per_s']:,}/s, indexed "
            f"{row['indexed_decisions_per_s']:,}/s; poll: views "
            f"{row['views_per_poll_s'] * 1e3:.3f} ms + index {row['index_per_poll_s'] * 1e3:.3f} ms"
        )
    return rows
