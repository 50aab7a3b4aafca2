"""The generated block of docs/benchmarks.md for ``bench/results/hostile.json``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from docgen import RESULTS
from meta import meta_line


def _load() -> dict[str, Any]:
    return dict(json.loads((RESULTS / "hostile.json").read_text(encoding="utf-8")))


def _p95(row: dict[str, Any], idle: bool) -> str:
    if "p95_ms" not in row:
        return "-"
    cell = f"{row['p95_ms']:.1f} ms"
    return cell if idle else f"{cell} (**{row['ratio_p95']:.2f}x**)"


def _served(row: dict[str, Any]) -> str:
    statuses = row["statuses"]
    total = sum(statuses.values())
    others = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()) if s != "200")
    return f"{statuses.get('200', 0)}/{total}" + (f" ({others})" if others else "")


def _attacker(row: dict[str, Any]) -> str:
    attack = row.get("attacker")
    if attack is None:
        return "-"
    answers = ", ".join(f"{n} {a}" for a, n in sorted(attack["answers"].items()))
    wait = attack["first_answer_ms"]
    return (
        f"{attack['connections_opened']} opened; {answers}; first byte of a refusal "
        f"p50 {wait['p50']} ms, p95 {wait['p95']} ms"
    )


def hostile() -> str:
    report = _load()
    settings = report["meta"]["settings"]
    cases = report["cases"]
    lines = [
        "| attacker | /health p95 | TTS p95 | the other client served (health, TTS, chat) "
        "| daemon CPU | what the attacker's connections got |",
        "|---|---:|---:|---|---:|---|",
    ]
    for name, row in cases.items():
        lat = row["latency"]
        idle = name == "idle"
        served = ", ".join(_served(lat[k]) for k in ("health", "tts", "chat"))
        lines.append(
            f"| {name} | {_p95(lat['health'], idle)} | {_p95(lat['tts'], idle)} | {served} "
            f"| {row['daemon_cpu']:.2f} | {_attacker(row)} |"
        )
    verdict = "met" if report["worst_ratio_p95"] <= report["target_ratio"] else "missed"
    lines += [
        "",
        f"{settings['hostile_connections']} hostile connections from one address "
        f"(127.0.0.1), each re-opened {settings['reconnect_s']:g} s after the daemon closed "
        f"it, dripping a byte every {settings['drip_s']:g} s; the other client on 127.0.0.2, "
        f"{settings['samples']} requests of each kind, each on a new connection. Worst p95 "
        f"ratio **{report['worst_ratio_p95']:.2f}x** (target {report['target_ratio']}x: "
        f"{verdict}); every request of the other client served: "
        f"**{'yes' if report['other_client_all_served'] else 'no'}**. Daemon CPU: its CPU "
        "time over the case's wall time (1.00 is one core).",
        "",
        f"Run: {meta_line(report['meta'])}, 1-minute load average at start "
        f"{report['meta']['machine']['load_avg_1m']}; `python bench/bench_hostile.py`.",
    ]
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[], str]] = {"hostile": hostile}
