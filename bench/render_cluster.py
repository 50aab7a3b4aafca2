"""Doc blocks for the cluster benchmark (``bench/results/cluster.json``): the gateway's
hop against calling a node's daemon directly (latency, requests/s, streamed pieces), how
fast a lost node is marked down, what a lost machine costs the others and how fast it
comes back, the router's decisions per second by number of nodes, and the figures
docs/cluster.md's scaling section reads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from render_bench import Report, _run, load

COMMAND = "python bench/bench_cluster.py"
#: The issue's targets for the hop.
ADDED_P50_MS = 1.0
ADDED_P95_MS = 2.0
RATE_SHARE = 0.5
DOWN_S = 2.0
SUCCESS = 0.99
RETURN_S = 60.0


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f}"


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _load(report: Report) -> str:
    m = report["meta"]["machine"]
    before, after = m.get("load_avg_1m", "?"), m.get("load_avg_1m_after", "?")
    return f"Machine load average (1 min) {before} before, {after} after"


def _row(label: str, r: dict[str, Any]) -> str:
    return f"| {label} | {_ms(r['p50_s'])} | {_ms(r['p95_s'])} | {_ms(r['p99_s'])} |"


def hop(report: Report) -> str:
    lat = report["latency"]
    rate = report["throughput"]
    lines = [
        "| target | p50 ms | p95 ms | p99 ms |",
        "|---|---:|---:|---:|",
        _row("mini's daemon, directly (from a third machine of the LAN)", lat["direct_mini"]),
        _row("through the gateway on gpu-box, to mini across the LAN", lat["gateway_mini"]),
        _row("gpu-box's daemon, directly", lat["direct_gpu"]),
        _row("through the gateway on gpu-box, to gpu-box", lat["gateway_gpu"]),
    ]
    added = {}
    for label, g, d in (
        ("to mini", "gateway_mini", "direct_mini"),
        ("to gpu-box", "gateway_gpu", "direct_gpu"),
    ):
        p50 = _diff(lat[g]["p50_s"], lat[d]["p50_s"])
        p95 = _diff(lat[g]["p95_s"], lat[d]["p95_s"])
        p99 = _diff(lat[g]["p99_s"], lat[d]["p99_s"])
        added[label] = (p50, p95)
        lines.append(
            f"| **added by the gateway, {label}** | **{_ms(p50)}** | **{_ms(p95)}** | {_ms(p99)} |"
        )
    direct = rate["direct_mini"]["requests_per_s"]
    via = rate["gateway_mini"]["requests_per_s"]
    share = via / direct if direct else 0.0
    worst50 = max(a[0] or 0 for a in added.values()) * 1000
    worst95 = max(a[1] or 0 for a in added.values()) * 1000
    s = report["meta"]["settings"]
    n = lat["gateway_mini"]["n_per_round"]
    rounds = len(lat["gateway_mini"]["rounds"])
    streams = report["streams"]
    lines += [
        "",
        "| requests/s, concurrent clients | mini's daemon directly | through the gateway | share |",
        "|---|---:|---:|---:|",
        f"| {s['clients']} clients, {s['throughput_s']:g} s a round, median of "
        f"{len(rate['direct_mini']['rounds'])} alternated rounds | {direct:,.0f} | {via:,.0f} | "
        f"**{share:.0%}** |",
        "",
        "| a streamed answer (12 pieces, 50 ms apart) | first piece, p50 ms "
        "| gap between pieces, p50 ms | p95 ms | pieces received |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, key in (("directly", "direct_mini"), ("through the gateway", "gateway_mini")):
        st = streams[key]
        lines.append(
            f"| {label} | {_ms(st['first_piece']['p50_s'])} | {_ms(st['gap']['p50_s'])} "
            f"| {_ms(st['gap']['p95_s'])} | {st['pieces_per_answer']:g} |"
        )
    lines += [
        "",
        f"Targets: added p50 at most {ADDED_P50_MS:g} ms ({_met(worst50 <= ADDED_P50_MS)}: "
        f"{worst50:.2f} ms at worst), added p95 at most {ADDED_P95_MS:g} ms "
        f"({_met(worst95 <= ADDED_P95_MS)}: {worst95:.2f} ms), at least {RATE_SHARE:.0%} of "
        f"the daemon's requests/s ({_met(share >= RATE_SHARE)}: {share:.0%}); pieces relayed "
        "as they come (the gaps through the gateway are the node's). Latency: "
        f"{n:,} sequential requests per target and round, the four targets interleaved "
        f"request by request, {rounds} rounds, medians over the rounds (the added rows: "
        f"the difference of those medians); a fake chat service of no service time. "
        f"{_load(report)}. " + _run(report, COMMAND),
    ]
    return "\n".join(lines)


def recovery(report: Report) -> str:
    d = report["detection"]
    rows = [
        "| event | marked down after, p50 s | max s | then |",
        "|---|---:|---:|---|",
        f"| a node's daemon killed (its port refuses) | {d['daemon_killed_down_s']['p50_s']:.2f} "
        f"| {d['daemon_killed_down_s']['max_s']:.2f} | its agent starts it again: serving "
        f"after {d['daemon_killed_serving_again_s']['p50_s']:.2f} s (p50) |",
        f"| a node's machine silent (its link down) | {d['machine_silent_down_s']['p50_s']:.2f} "
        f"| {d['machine_silent_down_s']['max_s']:.2f} | link up: serving after "
        f"{d['machine_back_up_s']['p50_s']:.2f} s (p50) |",
    ]
    worst_down = max(d["daemon_killed_down_s"]["max_s"], d["machine_silent_down_s"]["max_s"])
    rows += [
        "",
        "| machine killed (every process) | clients through the gateway on "
        "| chat requests while it was lost | succeeded "
        "| full service after its return (its units, nothing typed) "
        "| Ray cluster re-formed after |",
        "|---|---|---:|---:|---:|---:|",
    ]
    worst_rate = 1.0
    worst_return = 0.0
    for r in report["recovery"]:
        ok = r["success_rate_while_lost"] or 0.0
        worst_rate = min(worst_rate, ok)
        worst_return = max(worst_return, r["full_service_after_return_s"])
        head = " (the Ray head)" if r["machine"] == "gpu-box" else ""
        rows.append(
            f"| {r['machine']}{head} | {r['gateway_on']} | {r['requests_while_lost']:,} "
            f"| **{ok:.2%}** | **{r['full_service_after_return_s']:.1f} s** "
            f"| {r['ray_re_formed_after_return_s']:.1f} s |"
        )
    s = report["meta"]["settings"]
    rows += [
        "",
        f"Targets: down within {DOWN_S:g} s ({_met(worst_down <= DOWN_S)}: {worst_down:.2f} s at "
        f"worst over {d['trials']} trials of each kind), at least {SUCCESS:.0%} success for a "
        "service that also lives elsewhere while a machine is lost "
        f"({_met(worst_rate >= SUCCESS)}: {worst_rate:.2%} at worst), full service within "
        f"{RETURN_S:g} s of its return "
        f"({_met(worst_return <= RETURN_S)}: {worst_return:.1f} s at worst). "
        f"{s['load_clients']} clients send chat completions (chat may run on both machines) "
        f'without pause from 3 s before the kill; "while it was lost": those asked in the '
        f"{s['window_s']:g} s after the kill. Full service: chat, embeddings (only on mini) "
        "and image (only on gpu-box) all answer through that gateway. "
        f"{_load(report)}. " + _run(report, COMMAND),
    ]
    return "\n".join(rows)


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
        "stack's 8 services in varied states, classes and loads, and every model is hosted "
        f"on every node (the worst case for a decision); one node's snapshot is {size:,} "
        "bytes of JSON. A poll's cost is what the gateway's event loop spends when every "
        "snapshot changed (an unchanged one keeps its view). " + _run(report, COMMAND),
    ]
    return "\n".join(lines)


def scale(report: Report) -> str:
    rows = {r["nodes"]: r for r in report["router"]}
    lat = report["latency"]
    added = _diff(lat["gateway_mini"]["p50_s"], lat["direct_mini"]["p50_s"])
    interval = 0.5
    lines = [
        "| nodes | snapshot polls/s at the gateway | views + index: gateway CPU (% of a core) "
        "| routing decisions/s (indexed) |",
        "|---:|---:|---:|---:|",
    ]
    for n in (10, 100, 1000):
        r = rows[n]
        per_poll = r["views_per_poll_s"] + r["index_per_poll_s"]
        lines.append(
            f"| {n:,} | {n / interval:,.0f} | {per_poll / interval:.1%} "
            f"| {r['indexed_decisions_per_s']:,} |"
        )
    lines += [
        "",
        f"Measured on this machine (poll every {interval:g} s, every snapshot changed); the "
        f"gateway adds {_ms(added)} ms at the median to a request to another machine. "
        + _run(report, COMMAND),
    ]
    return "\n".join(lines)


def _blocks() -> dict[str, Callable[[], str]]:
    def on(fn: Callable[[Any], str]) -> Callable[[], str]:
        return lambda: fn(load("cluster"))

    return {
        "cluster-hop": on(hop),
        "cluster-recovery": on(recovery),
        "cluster-router": on(router),
        "cluster-scale": on(scale),
    }


BLOCKS: dict[str, Callable[[], str]] = _blocks()
