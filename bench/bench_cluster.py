"""Cluster mode: what the cluster gateway adds, and how its decisions scale with nodes.

One run starts a local Ray cluster on this machine (a head and three extra Ray nodes,
each its own raylet and object store, all on this host), a node agent on each with
fake services, and one cluster gateway (``accelmux serve --cluster``) in a process of
its own, then measures:

* **latency** of a non-streaming chat completion (fake backend, no service time),
  sequential, the targets interleaved request by request: straight to the node daemon
  of the gateway's own Ray node, through the gateway to that node ("same node"),
  straight to another node's daemon, and through the gateway to that node ("other
  node"); ``repeat`` rounds of ``samples`` requests per target;
* **the pure router** (:func:`accelmux.core.routing.route`): decisions per second over
  realistic views of 1, 2, 4 nodes (and, for docs/cluster.md's part 3, 10, 100 and
  1,000), and the cost of turning the nodes' snapshots into views, what the gateway
  pays per poll;
* **a snapshot call**: the round trip of one agent's ``snapshot()`` from a Ray driver;
* **end to end**: requests/s through the gateway with a service hosted on 1, 2 and 4
  nodes (fake service time ``service_s``, ``concurrency`` 2 per node), 16 clients.

All the "nodes" share this machine's 2 cores, so "other node" measures Ray's cross-raylet
path on loopback, not a network, and the end-to-end rate says how well the gateway
spreads load, not what 4 machines would serve.

    .venv/bin/python bench/bench_cluster.py          # writes bench/results/cluster.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from meta import run_meta
from stats import summary

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.cluster.support import (  # noqa: E402
    fake,
    gateway,
    get_json,
    local_cluster,
    wait_until,
    write_config,
)

from accelmux.cluster.snapshots import view_of  # noqa: E402
from accelmux.core.routing import NodeView, build_index, route, route_indexed  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "cluster.json"
NODES = ["a", "b", "c", "d"]
LLM = {"weights": "128MiB", "kv_per_token": "16KiB", "kv_ceiling": "32MiB"}
BODY = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
HEADERS = {"Content-Type": "application/json"}
SCALES = (1, 2, 4)
ROUTER_SCALES = (1, 2, 4, 10, 100, 1000)


def chat_service(nodes: list[str], **backend: Any) -> dict[str, Any]:
    return {
        "kind": "chat",
        "memory": LLM,
        "nodes": nodes,
        "concurrency": 2,
        "residency": "pinned",
        "backend": fake(**backend),
    }


def config(data_dir: Path, service_s: float) -> dict[str, Any]:
    services = {f"on-{n}": chat_service([n]) for n in NODES}
    for k in SCALES:
        services[f"spread-{k}"] = chat_service(NODES[:k], latency_s=service_s)
    return {
        "devices": {"gpu": {"kind": "virtual", "capacity": "4GiB", "headroom": "128MiB"}},
        "cluster": {"nodes": NODES, "snapshot_interval_s": 0.5},
        "services": services,
        "server": {"data_dir": str(data_dir), "jobs": False, "dashboard": False},
    }


# ---- the pure router ------------------------------------------------------------------


def synthetic_snapshots(count: int, rnd: random.Random) -> list[dict[str, Any]]:
    """``count`` nodes as the agents report them: the default stack's 8 services on
    each, in varied states and loads."""
    kinds = ["chat", "completion", "embeddings", "image", "asr", "tts", "detect", "chat"]
    states = ["loaded", "loaded", "loaded", "unloaded", "loading"]
    out = []
    for i in range(count):
        services = []
        for j, kind in enumerate(kinds):
            services.append(
                {
                    "service": f"svc{j}",
                    "kind": kind,
                    "models": [f"svc{j}", f"alias{j}"],
                    "state": rnd.choice(states),
                    "inflight": rnd.randint(0, 2),
                    "waiting": rnd.randint(0, 3),
                    "concurrency": 2,
                    "device": "gpu",
                    "load_bytes": rnd.randint(64, 4096) * 2**20,
                    "backing_off": False,
                }
            )
        out.append(
            {
                "node": f"n{i:04d}",
                "port": 1,
                "stopping": False,
                "devices": {
                    "gpu": {
                        "budget_bytes": 24 * 2**30,
                        "available_bytes": rnd.randint(0, 24) * 2**30,
                    }
                },
                "services": services,
                "queues": {},
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
    """Per scale: decisions/s of the scan (:func:`route`) and of the indexed route the
    gateway uses, and what one poll costs the gateway (snapshots -> views -> index)."""
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


# ---- live measurements ------------------------------------------------------------


async def timed_post(session: aiohttp.ClientSession, url: str, model: str) -> float:
    body = json.dumps({"model": model, **BODY}).encode()
    started = time.perf_counter()
    async with session.post(url + "/v1/chat/completions", data=body, headers=HEADERS) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url} {model}: HTTP {resp.status}")
    return time.perf_counter() - started


async def latency(targets: dict[str, tuple[str, str]], samples: int, repeat: int) -> dict[str, Any]:
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
    async with aiohttp.ClientSession() as session:
        for url, model in targets.values():  # warm: connections, loads
            for _ in range(20):
                await timed_post(session, url, model)
        for r in range(repeat):
            got: dict[str, list[float]] = {name: [] for name in targets}
            for _ in range(samples):
                for name, (url, model) in targets.items():
                    got[name].append(await timed_post(session, url, model))
            for name, values in got.items():
                rounds[name].append(summary(values, digits=6))
            print(
                f"latency round {r + 1}: "
                + ", ".join(f"{n} p50 {rounds[n][-1]['p50_s'] * 1e3:.2f} ms" for n in targets)
            )
    out: dict[str, Any] = {}
    for name, per_round in rounds.items():
        out[name] = {
            "rounds": per_round,
            **{
                key: statistics.median(r[key] for r in per_round)
                for key in ("p50_s", "p95_s", "p99_s")
            },
            "n_per_round": samples,
        }
    return out


async def throughput(url: str, model: str, clients: int, seconds: float) -> dict[str, Any]:
    done = 0
    errors = 0
    deadline = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for _ in range(clients):  # warm
            await timed_post(session, url, model)

        async def client() -> None:
            nonlocal done, errors
            while time.perf_counter() < deadline:
                try:
                    await timed_post(session, url, model)
                    done += 1
                except RuntimeError:
                    errors += 1

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        took = time.perf_counter() - started
    return {"requests_per_s": round(done / took, 1), "requests": done, "errors": errors}


def snapshot_round_trip(address: str, calls: int) -> dict[str, Any]:
    import ray

    from accelmux.cluster.ray_link import NAMESPACE, agent_name

    ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
    try:
        agent = ray.get_actor(agent_name("b"))
        ray.get(agent.snapshot.remote())
        values = []
        cpu = time.process_time()
        for _ in range(calls):
            started = time.perf_counter()
            ray.get(agent.snapshot.remote())
            values.append(time.perf_counter() - started)
        cpu_per_call = (time.process_time() - cpu) / calls
    finally:
        ray.shutdown()
    # The caller's own CPU per call (this process, all its threads): what a gateway pays
    # per snapshot it polls, beside the agent's work.
    return summary(values, digits=6) | {"caller_cpu_per_call_s": round(cpu_per_call, 6)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=400, help="latency requests per target/round")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--router-s", type=float, default=1.0, help="seconds per router scale")
    ap.add_argument("--throughput-s", type=float, default=5.0)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--service-s", type=float, default=0.02)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    settings.pop("out")
    meta = run_meta(settings)
    started = time.monotonic()
    router = bench_router(args.router_s)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="accelmux-bench-cluster-") as tmp:
        cfg = write_config(Path(tmp) / "cluster.yaml", config(Path(tmp) / "data", args.service_s))
        with local_cluster(NODES) as local:
            local.start_agents(NODES, cfg)
            with gateway(local.address, cfg) as url:

                def alive() -> bool:
                    status, body = get_json(url + "/admin/cluster")
                    return (
                        status == 200
                        and all(n["alive"] for n in body["nodes"])
                        and len(body["nodes"]) == len(NODES)
                    )

                wait_until("every node", alive, timeout=60)
                _, body = get_json(url + "/admin/cluster")
                own = body["gateway"]["ray_node_id"]
                by_node = {n["node"]: n for n in body["nodes"]}
                same = next(n for n, v in by_node.items() if v["ray_node_id"] == own)
                other = next(n for n in NODES if n != same)
                port = {n: v["daemon_port"] for n, v in by_node.items()}
                targets = {
                    "direct_same": (f"http://127.0.0.1:{port[same]}", f"on-{same}"),
                    "gateway_same": (url, f"on-{same}"),
                    "direct_other": (f"http://127.0.0.1:{port[other]}", f"on-{other}"),
                    "gateway_other": (url, f"on-{other}"),
                }
                lat = asyncio.run(latency(targets, args.samples, args.repeat))
                snap = snapshot_round_trip(local.address, 200)
                print(f"snapshot round trip p50 {snap['p50_s'] * 1e3:.2f} ms")
                e2e = []
                for k in SCALES:
                    row = asyncio.run(
                        throughput(url, f"spread-{k}", args.clients, args.throughput_s)
                    )
                    row["nodes"] = k
                    e2e.append(row)
                    print(f"end to end, {k} node(s): {row['requests_per_s']} requests/s")
    report = {
        "meta": meta,
        "layout": {"same_node": same, "other_node": other, "nodes": len(NODES)},
        "latency": lat,
        "router": router,
        "snapshot_round_trip": snap,
        "end_to_end": e2e,
        "wall_s": round(time.monotonic() - started, 1),
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
