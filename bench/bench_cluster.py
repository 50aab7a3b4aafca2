"""Cluster mode: what the gateway's hop costs, how fast a lost node is noticed, what a lost
machine costs the others and how fast it comes back; and how routing scales with nodes.

One run brings up two machines made of Linux namespaces (gpu-box and mini: each its own
address, ports and process table, a real LAN between them, no emulated latency) by
docs/cluster.md's steps, with fake services (no service time, so the figures are the
path's own), and measures, side by side in one run (``cluster_lan.py``):

* the hop: a chat completion sent to a node's daemon directly (with the cluster's key,
  as the gateway sends it) and through the gateway on gpu-box (to gpu-box itself, and
  across the LAN to mini), interleaved request by request; requests/s of mini's daemon
  directly and through the gateway, rounds alternated; a streamed answer's pieces;
* detection: a node's daemon killed, a node's machine gone silent (its link down);
* recovery: mini, then gpu-box (the Ray head), killed under load and brought back by
  their units alone;

and the pure router over synthetic views of up to 1,000 nodes (``cluster_router.py``).
Everything shares this machine's 2 cores: the clients, the gateway and both machines.

    flock /work/heavy.lock .venv/bin/python bench/bench_cluster.py   # bench/results/cluster.json

Needs root (network and PID namespaces) and Ray (the cluster extra).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from cluster_router import bench_router
from meta import run_meta

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cluster_lan  # noqa: E402
from tests.cluster.household import ADMIN_KEY, API_KEY, household, wait_until  # noqa: E402
from tests.live.support import fake  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "cluster.json"


def bench_config() -> dict[str, Any]:
    """The example's household (examples/cluster-fake.yaml) and, for the hop, a service
    of no service time pinned on each machine and a slowly streaming one on mini."""
    import yaml

    data: dict[str, Any] = yaml.safe_load(
        (ROOT / "examples" / "cluster-fake.yaml").read_text(encoding="utf-8")
    )
    small = {"weights": "128MiB", "kv_per_token": "16KiB", "kv_ceiling": "32MiB"}
    for name, node, backend in (
        ("on-gpu", "gpu-box", fake()),
        ("on-mini", "mini", fake()),
        ("slow-mini", "mini", fake(stream_chunk_s=0.05)),
    ):
        data["services"][name] = {
            "kind": "chat",
            "memory": small,
            "nodes": [node],
            "concurrency": 64,
            "residency": "pinned",
            "backend": backend,
        }
    assert data["server"]["api_keys"] == [API_KEY] and data["server"]["admin_key"] == ADMIN_KEY
    return data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=400, help="latency requests per target/round")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--throughput-s", type=float, default=5.0)
    ap.add_argument("--streams", type=int, default=30)
    ap.add_argument("--trials", type=int, default=5, help="detection trials of each kind")
    ap.add_argument("--window-s", type=float, default=20.0, help="load kept after a kill")
    ap.add_argument("--load-clients", type=int, default=8)
    ap.add_argument("--router-s", type=float, default=1.0, help="seconds per router scale")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    settings.pop("out")
    meta = run_meta(settings)
    started = time.monotonic()
    router = bench_router(args.router_s)
    with household() as h:
        h.write_config(bench_config())
        h.follow_the_steps()
        wait_until(
            "both nodes", lambda: cluster_lan._up(h, "mini") and cluster_lan._up(h, "gpu-box"), 60
        )
        lat = asyncio.run(cluster_lan.latency(h, args.samples, args.repeat))
        rps = asyncio.run(cluster_lan.throughput(h, args.clients, args.throughput_s, args.repeat))
        streamed = asyncio.run(cluster_lan.streams(h, args.streams))
        detect = cluster_lan.detection(h, args.trials)
        recovered = cluster_lan.recovery(h, args.window_s, args.load_clients)
    meta["machine"]["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    report = {
        "meta": meta,
        "latency": lat,
        "throughput": rps,
        "streams": streamed,
        "detection": detect,
        "recovery": recovered,
        "router": router,
        "wall_s": round(time.monotonic() - started, 1),
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
