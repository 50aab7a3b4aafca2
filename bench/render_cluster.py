"""Doc blocks for the cluster benchmark (``bench/results/cluster.json``): the gateway's
added latency to the same and to another Ray node, the router's decisions per second by
number of nodes, end-to-end requests/s, and the figures docs/cluster.md's scaling
section reads."""

from __future__ import annotations

from collections.abc import Callable

from render_bench import Report, _run, load

COMMAND = "python bench/bench_cluster.py"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f}"


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def latency(report: Report) -> str:
    lat = report["latency"]
    layout = report["layout"]
    same, other = layout["same_node"], layout["other_node"]
    rows = [
        (f"node `{same}`'s daemon called directly", lat["direct_same"]),
        (f"through the cluster gateway to node `{same}` (same Ray node)", lat["gateway_same"]),
        (f"node `{other}`'s daemon called directly", lat["direct_other"]),
        (f"through the cluster gateway to node `{other}` (another Ray node)", lat["gateway_other"]),
    ]
    lines = ["| target | p50 ms | p95 ms | p99 ms |", "|---|---:|---:|---:|"]
    for label, r in rows:
        lines.append(f"| {label} | {_ms(r['p50_s'])} | {_ms(r['p95_s'])} | {_ms(r['p99_s'])} |")
    for label, g, d in (
        ("same node", lat["gateway_same"], lat["direct_same"]),
        ("other node", lat["gateway_other"], lat["direct_other"]),
    ):
        lines.append(
            f"| **added by the cluster gateway, {label}** "
            + " ".join(f"| **{_ms(_diff(g[k], d[k]))}**" for k in ("p50_s", "p95_s", "p99_s"))
            + " |"
        )
    n = lat["gateway_same"]["n_per_round"]
    rounds = len(lat["gateway_same"]["rounds"])
    snap = report["snapshot_round_trip"]
    lines += [
        "",
        f"{n:,} sequential requests per target and round, the four targets interleaved "
        f"request by request, {rounds} rounds; medians over the rounds (the added rows: the "
        "difference of those medians). One agent's `snapshot()` from a Ray driver takes "
        f"{_ms(snap['p50_s'])} ms at the median and {_ms(snap['p99_s'])} ms at the p99 "
        f"({snap['n']} calls), and costs the calling process "
        f"{_ms(snap.get('caller_cpu_per_call_s'))} ms of CPU. Machine load average (1 min) "
        "at the start: "
        f"{report['meta']['machine'].get('load_avg_1m', '?')}. " + _run(report, COMMAND),
    ]
    return "\n".join(lines)


def router(report: Report) -> str:
    lines = [
        "| nodes | decisions/s, scan (`route`) | decisions/s, indexed (`route_indexed`) "
        "| one poll: snapshots to views (ms) | one poll: index (ms) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in report["router"]:
        lines.append(
            f"| {r['nodes']:,} | {r['scan_decisions_per_s']:,} | {r['indexed_decisions_per_s']:,} "
            f"| {_ms(r['views_per_poll_s'])} | {_ms(r['index_per_poll_s'])} |"
        )
    size = report["router"][0]["snapshot_bytes"]
    lines += [
        "",
        "The pure routing functions over synthetic views: every node hosts the default "
        "stack's 8 services in varied states and loads, and every model is hosted on every "
        f"node (the worst case for a decision); one node's snapshot is {size:,} bytes of "
        "JSON. A poll's cost is what the gateway's event loop spends when every snapshot "
        "changed (an unchanged one keeps its view). " + _run(report, COMMAND),
    ]
    return "\n".join(lines)


def end_to_end(report: Report) -> str:
    s = report["meta"]["settings"]
    lines = ["| nodes hosting the service | requests/s | errors |", "|---:|---:|---:|"]
    for r in report["end_to_end"]:
        lines.append(f"| {r['nodes']} | {r['requests_per_s']:,.1f} | {r['errors']} |")
    one = report["end_to_end"][0]["requests_per_s"]
    last = report["end_to_end"][-1]
    lines += [
        "",
        f"{s['clients']} clients for {s['throughput_s']:g} s each, non-streaming chat "
        f"completions through the gateway to a fake service of {s['service_s'] * 1000:g} ms "
        f"per request and concurrency 2 on each node hosting it (so one node serves at most "
        f"{2 / s['service_s']:,.0f}/s): {last['nodes']} nodes serve "
        f"{last['requests_per_s'] / one:.1f}x one node. " + _run(report, COMMAND),
    ]
    return "\n".join(lines)


def scale(report: Report) -> str:
    rows = {r["nodes"]: r for r in report["router"]}
    lat = report["latency"]
    added = _diff(lat["gateway_other"]["p50_s"], lat["direct_other"]["p50_s"])
    interval = 0.5
    call_cpu = report["snapshot_round_trip"].get("caller_cpu_per_call_s") or 0.0
    lines = [
        "| nodes | snapshot calls/s at the gateway | Ray calls: gateway CPU (% of a core) "
        "| views + index: gateway CPU (% of a core) | routing decisions/s (indexed) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for n in (10, 100, 1000):
        r = rows[n]
        per_poll = r["views_per_poll_s"] + r["index_per_poll_s"]
        calls = n / interval
        lines.append(
            f"| {n:,} | {calls:,.0f} | {calls * call_cpu:.1%} | {per_poll / interval:.1%} "
            f"| {r['indexed_decisions_per_s']:,} |"
        )
    lines += [
        "",
        f"Measured on this machine (poll every {interval:g} s, every snapshot changed); the "
        f"gateway adds {_ms(added)} ms at the median to a request on another node. "
        + _run(report, COMMAND),
    ]
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[], str]] = {
    "cluster-latency": lambda: latency(load("cluster")),
    "cluster-router": lambda: router(load("cluster")),
    "cluster-end-to-end": lambda: end_to_end(load("cluster")),
    "cluster-scale": lambda: scale(load("cluster")),
}
