"""Doc blocks for the gateway, manager, stack and models benchmarks, from their JSON.

Each function takes the benchmark's report (as written to ``bench/results/NAME.json``)
and returns Markdown; ``BLOCKS`` binds them to the committed files for
``scripts/gen-docs`` (see ``bench/docgen.py``). Every block ends with the run's commit,
date and machine, and every percentile says how many samples it was read from.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meta import meta_line

RESULTS = Path(__file__).resolve().parent / "results"
MIB = 2**20

Report = dict[str, Any]


def load(name: str) -> Report:
    data: Report = json.loads((RESULTS / f"{name}.json").read_text(encoding="utf-8"))
    return data


def _run(report: Report, command: str) -> str:
    return f"Run: {meta_line(report.get('meta', {}))}; `{command}`."


def _mib(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value / MIB:,.{digits}f}"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"**{value:.2f}**"


# ---- manager --------------------------------------------------------------------------
#: The events/s the Manager must reach per case (services), and the busy week's seconds.
MANAGER_TARGETS = {100: 50_000, 1000: 20_000}
WEEK_TARGET_S = 60.0


def manager(report: Report) -> str:
    lines = [
        "| services | devices | events per run | repeats | events/s | actions/s | µs per event |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in report["cases"]:
        lines.append(
            f"| {c['services']} | {c['devices']} | {c['events_per_run']:,} | {c['repeats']} "
            f"| {c['events_per_s']:,.0f} | {c['actions_per_s']:,.0f} "
            f"| {c['us_per_event']:,.0f} |"
        )
    command = "python bench/bench_manager.py"
    compared = report.get("comparison")
    if compared:
        command += f" --against <checkout of {compared['against'][:10]}>"
    lines += ["", "Medians over the repeats. " + _run(report, command)]
    if compared:
        lines += ["", *_manager_comparison(compared)]
    return "\n".join(lines)


def _manager_comparison(compared: Report) -> list[str]:
    """The side-by-side runs of ``--against``: the older core, then this one, per round."""
    old = compared["against"][:10]
    with_ir = any(c.get("new_instructions_per_event") for c in compared["cases"])
    head = f"| services | `{old}` events/s | this commit events/s | speedup |"
    rule = "|---:|---:|---:|---:|"
    if with_ir:
        head += f" `{old}` instructions/event | this commit instructions/event | target |"
        rule += "---:|---:|---|"
    lines = [head, rule]
    for c in compared["cases"]:
        row = (
            f"| {c['services']} | {c['old_median']:,.0f} | {c['new_median']:,.0f} "
            f"| **{c['speedup']:.2f}x** |"
        )
        if with_ir:
            target = MANAGER_TARGETS.get(c["services"])
            verdict = (
                "-"
                if target is None
                else f"{target:,} events/s: "
                + (
                    "met"
                    if c["new_median"] >= target
                    else f"missed ({c['new_median'] / target:.0%})"
                )
            )
            row += (
                f" {_k(c.get('old_instructions_per_event'))} "
                f"| {_k(c.get('new_instructions_per_event'))} | {verdict} |"
            )
        lines.append(row)
    lines += [
        "",
        f"Side by side in the same run: {compared['rounds']} rounds, each one process with "
        f"the core of `{old}`, then one with this commit's (same workload and seed); "
        "medians of the rounds."
        + (
            " Instructions per event: valgrind's callgrind, the difference of a "
            "1,200-event and a 200-event run of the same case (start-up and imports cancel "
            "out), which the machine's load does not move."
            if with_ir
            else ""
        ),
    ]
    week = compared.get("week")
    if week:
        new_s = week["new_projected_week_s"]
        lines += [
            "",
            "| busy week | home | simulated per round | events per round | "
            f"`{old}` | this commit | target |",
            "|---|---|---:|---:|---:|---:|---|",
            f"| simulator + Manager, projected to 168 h | generated seed {week['seed']} "
            f"| {week['hours']:g} h | {week['events']:,} "
            f"| {week['old_projected_week_s']:,.0f} s | {new_s:,.0f} s | under "
            f"{WEEK_TARGET_S:.0f} s: "
            + ("met" if new_s < WEEK_TARGET_S else f"missed ({new_s / WEEK_TARGET_S:.0f}x over)")
            + " |",
            "",
            f"The busy week: the first generated home with 8-12 services of every class "
            f"(seed {week['seed']}), replayed by the simulator with the accelmux policy; "
            f"each of {len(week['new_runs'])} rounds times {week['hours']:g} simulated hours "
            "with each core and projects the week in proportion (medians of the rounds; "
            "`--week --week-hours 168` runs the whole week).",
        ]
    return lines


def _k(value: float | None) -> str:
    """Instructions as thousands (``-``: not measured)."""
    return "-" if value is None else f"{value / 1000:,.0f}k"


# ---- gateway --------------------------------------------------------------------------
#: The targets of bench_gateway.py's JSON, by label.
GATEWAY_TARGETS = {
    "direct": "upstream called directly",
    "bare_proxy": "bare proxy on aiohttp (server and client; no accelmux logic)",
    "bare_fast_proxy": "bare proxy on the hot path's stack (httptools on uvloop, pooled client)",
    "accelmux_aiohttp": "accelmux, every request through aiohttp (`server.hot_path: false`)",
    "accelmux": "**accelmux, hot path** (the default)",
}


def _cell(figures: dict[str, Any] | None, key: str, fmt: str) -> str:
    if figures is None or key not in figures:
        return "-"
    return format(figures[key], fmt)


def gateway(report: Report) -> str:
    s = report["settings"]
    targets, added = report["targets"], report["added"]
    conc = s["concurrency"]
    lines = [
        f"| target | chat p50 ms | chat p99 ms | chat req/s ({conc} clients) | embeddings p50 "
        f"ms | embeddings p99 ms | embeddings req/s | stream first byte p50 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, label in GATEWAY_TARGETS.items():
        t = targets[name]
        chat, emb, stream = t["chat"], t["embeddings"], t.get("stream")
        lines.append(
            f"| {label} | {chat['p50_ms']:.3f} | {chat['p99_ms']:.3f} | {chat['rps']:,.0f} "
            f"| {emb['p50_ms']:.3f} | {emb['p99_ms']:.3f} | {emb['rps']:,.0f} "
            f"| {_cell(stream, 'p50_ms', '.3f')} |"
        )
    lines += [
        "",
        "Added to the direct call (medians of the per-repeat differences; requests/s as a "
        "share of direct):",
        "",
        "| target | chat p50 | chat p99 | chat req/s | embeddings p50 | embeddings p99 "
        "| embeddings req/s | stream first byte |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, label in GATEWAY_TARGETS.items():
        if name == "direct":
            continue
        a = added[name]
        lines.append(
            f"| {label} | {a['chat']['p50_ms']:+.3f} ms | {a['chat']['p99_ms']:+.3f} ms "
            f"| {a['chat']['rps_of_direct']:.0%} | {a['embeddings']['p50_ms']:+.3f} ms "
            f"| {a['embeddings']['p99_ms']:+.3f} ms | {a['embeddings']['rps_of_direct']:.0%} "
            f"| {format(a['stream']['p50_ms'], '+.3f') + ' ms' if 'stream' in a else '-'} |"
        )
    goal = report["targets_issue_37"]
    hot = added["accelmux"]
    verdicts = []
    for route in ("chat", "embeddings"):
        r = hot[route]
        verdicts.append(
            f"{route}: added p50 {r['p50_ms']:.3f} ms (target {goal['added_p50_ms']} ms: "
            f"{_met(r['p50_ms'] <= goal['added_p50_ms'])}), p99 {r['p99_ms']:.3f} ms (target "
            f"{goal['added_p99_ms']} ms: {_met(r['p99_ms'] <= goal['added_p99_ms'])}), "
            f"{r['rps_of_direct']:.0%} of direct's requests/s (target "
            f"{goal['rps_of_direct']:.0%}: {_met(r['rps_of_direct'] >= goal['rps_of_direct'])})"
        )
    first = hot["stream"]["p50_ms"]
    verdicts.append(
        f"stream: first byte {first:+.3f} ms (target +{goal['first_byte_added_ms']} ms: "
        f"{_met(first <= goal['first_byte_added_ms'])})"
    )
    load_avg = report.get("loadavg_1m_before_after")
    lines += [
        "",
        "Targets (issue 37), the hot path: " + "; ".join(verdicts) + ".",
        "",
        f"{s['requests']:,} requests per target, route and repeat (p99 from {s['requests']:,} "
        f"samples), {s['repeats']} repeats, medians over the repeats. Stacks: "
        f"{s['stacks']['aiohttp']}; hot path {s['stacks']['hot path']}. Load average (1 min) "
        f"before and after: {load_avg[0] if load_avg else '?'} and "
        f"{load_avg[1] if load_avg else '?'}. " + _run(report, "python bench/bench_gateway.py"),
    ]
    return "\n".join(lines)


def _met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _minutes(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds / 60:.0f} min"


def _load(report: Report) -> str:
    return str(report.get("meta", {}).get("machine", {}).get("load_avg_1m", "?"))


def _load_range(report: Report) -> str:
    """The 1-minute load average before and after a run (or when it was recorded)."""
    both = report.get("loadavg_1m_before_after")
    return f"{both[0]} before, {both[1]} after" if both else _load(report)


# ---- stack ----------------------------------------------------------------------------
def stack_memory(report: Report) -> str:
    lines = [
        "| services | shared: processes | shared PSS | separate: processes | separate PSS "
        "| saved |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in report["memory"]:
        sh, sep = row["shared"], row["separate"]
        saved = sep["pss_total_bytes"] - sh["pss_total_bytes"]
        lines.append(
            f"| {row['label']} | {sh['processes']} | {_mib(sh['pss_total_bytes'], 0)} MiB "
            f"| {sep['processes']} | {_mib(sep['pss_total_bytes'], 0)} MiB "
            f"| {_mib(saved, 0)} MiB ({saved / sep['pss_total_bytes']:.0%}) |"
        )
    lines += ["", _run(report, "python bench/bench_stack.py")]
    return "\n".join(lines)


def stack_truth(report: Report) -> str:
    full = [row for row in report["memory"] if row["shared"].get("truth")]
    if not full:
        return "No memory-truth rows in this run (`--skip-memory`)."
    lines = [
        "| service | ledger (weights + runtime + KV), MiB | of which KV | measured by the worker,"
        " MiB | measured / ledger |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for r in full[0]["shared"]["truth"]:
        ratio = r["measured_bytes"] / r["ledger_bytes"] if r["ledger_bytes"] else None
        lines.append(
            f"| {r['service']} | {_mib(r['ledger_bytes'])} | {_mib(r['kv_bytes'])} "
            f"| {_mib(r['measured_bytes'])} | {'-' if ratio is None else f'{ratio:.2f}'} |"
        )
    lines += [
        "",
        f"The shared-worker run of the {full[0]['label']}, after one request per service. "
        + _run(report, "python bench/bench_stack.py"),
    ]
    return "\n".join(lines)


#: Targets of the protection table: loaded / alone at most this, for p50 and p95 ...
VOICE_RATIO_TARGET = 1.15
#: ... while the cameras keep at least this share of their frame rate outside the chains.
CAMERA_SHARE_TARGET = 0.75
SETUP_LABELS = {
    "accelmux": "accelmux",
    "accelmux-cameras-not-steady": "accelmux, cameras `steady: false`",
    "unmanaged": "no manager",
}


def _ci(value: float | None, interval: list[float] | None, fmt: str = "{:.2f}") -> str:
    if value is None:
        return "-"
    text = fmt.format(value)
    return text if not interval else f"{text} [{fmt.format(interval[0])}-{fmt.format(interval[1])}]"


def stack_voice(report: Report) -> str:
    s = report["settings"]
    if "blocks" not in s:
        return _stack_voice_before_blocks(report)
    lines = [
        "| setup | chains alone / loaded | alone p50 (s) | alone p95 (s) | loaded p50 (s) "
        "| loaded p95 (s) | ratio p50 | ratio p95 | camera frames/s outside chains "
        "(of nominal) | in chains | batch texts/s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    verdicts = []
    for key, label in SETUP_LABELS.items():
        r = report["protection"].get(key)
        if r is None:
            continue
        a, lo, ci, cam = r["alone"], r["loaded"], r["intervals"], r["camera"]
        window = r["window_s"] or 1.0
        lines.append(
            f"| {label} | {a['n']} / {lo['n']} | {_ci(a['p50_s'], ci['alone_p50'])} "
            f"| {_ci(a['p95_s'], ci['alone_p95'])} | {_ci(lo['p50_s'], ci['loaded_p50'])} "
            f"| {_ci(lo['p95_s'], ci['loaded_p95'])} "
            f"| **{_ci(r['ratio_p50'], ci['ratio_p50'])}** "
            f"| **{_ci(r['ratio_p95'], ci['ratio_p95'])}** "
            f"| {cam['fps_outside_chains']:.2f} ({cam['share_of_nominal_outside_chains']:.0%}) "
            f"| {cam['fps_in_chains']:.2f} "
            f"| {r['batch_texts_done_during_chains'] / window:,.1f} |"
        )
        if key != "unmanaged" and r["ratio_p95"] is not None:
            met = (
                r["ratio_p95"] <= VOICE_RATIO_TARGET
                and r["ratio_p50"] <= VOICE_RATIO_TARGET
                and cam["share_of_nominal_outside_chains"] >= CAMERA_SHARE_TARGET
            )
            verdicts.append(f"{label}: {'met' if met else '**not met**'}")
    lines += [
        "",
        f"{s['blocks']} blocks of {s['chains_per_block']} chains per phase, alone and loaded "
        "alternated (A B B A ...), each block on a fresh daemon (accelmux) or with the "
        f"load processes running or idle (no manager); chains {s['gap_s']:g} s apart; "
        f"embedding jobs of {s['texts_per_job']:,} texts; two cameras at {s['camera_fps']:g} "
        "frames/s each (nominal "
        f"{2 * s['camera_fps']:g} frames/s). In brackets: 95 % bootstrap intervals (2,000 "
        "resamples; a ratio's resamples both phases). Camera frames/s outside chains: "
        "frames analysed in the loaded blocks' time between chains, over that time. "
        f"Targets: voice p50 and p95 loaded / alone at most {VOICE_RATIO_TARGET:.2f}x with "
        f"the cameras at {CAMERA_SHARE_TARGET:.0%} or more of their rate outside chains: "
        + "; ".join(verdicts)
        + ". "
        f"The whole benchmark took {_minutes(report.get('wall_s'))}; load average (1 min) "
        f"at its start and end: {_load(report)} and {report.get('load_avg_1m_after', '?')}. "
        + _run(report, "python bench/bench_stack.py"),
    ]
    return "\n".join(lines)


def _stack_voice_before_blocks(report: Report) -> str:
    """The table of a run made before the blocks (one phase after the other)."""
    s = report["settings"]
    lines = [
        "| setup | chains alone / loaded | alone p50 / p95 (s) | loaded p50 / p95 (s) "
        "| ratio p95 (p50) | batch texts/s during the chains | camera frames/s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, label in (("accelmux", "accelmux"), ("unmanaged", "no manager")):
        r = report["protection"].get(key)
        if r is None:
            continue
        a, lo = r["alone"], r["loaded"]
        window = r["window_s"] or 1.0
        lines.append(
            f"| {label} | {a['n']} / {lo['n']} | {_s(a['p50_s'])} / {_s(a['p95_s'])} "
            f"| {_s(lo['p50_s'])} / {_s(lo['p95_s'])} "
            f"| {_ratio(r['ratio_p95'])} ({r['ratio_p50']:.2f}) "
            f"| {r['batch_texts_done_during_chains'] / window:,.1f} "
            f"| {r['camera_frames_during_chains'] / window:.1f} |"
        )
    lines += [
        "",
        f"Chains {s['gap_s']:g} s apart; embedding jobs of {s['texts_per_job']:,} texts; "
        f"two cameras at {s['camera_fps']:g} frames/s; a p95 only from at least 20 chains "
        '("-" below that). '
        f"The whole benchmark took {_minutes(report.get('wall_s'))}; load average (1 min) at "
        f"its start: {_load(report)}. " + _run(report, "python bench/bench_stack.py"),
    ]
    return "\n".join(lines)


# ---- models ---------------------------------------------------------------------------
def _label(r: Report) -> str:
    return str(r["model"]) + (f" n_ctx={r['n_ctx']}" if "n_ctx" in r else "")


def models_memory(report: Report) -> str:
    lines = [
        "| model | runtime import | load (peak) | 1st request peak | 2nd request peak "
        "| overall peak | steady | `memory_estimate()` | GGUF resident estimate |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in report["models"]:
        lines.append(
            f"| {_label(r)} | {_mib(r['import'])} | {_mib(r['load'])} ({_mib(r['load_peak'])}) "
            f"| {_mib(r['first_request_peak'])} | {_mib(r['request_peak'])} | {_mib(r['peak'])} "
            f"| {_mib(r['steady'])} | {_mib(r['estimate'])} "
            f"| {_mib(r.get('resident_estimate'))} |"
        )
    lines += ["", "MiB. " + _run(report, "python bench/bench_models.py")]
    return "\n".join(lines)


def models_speed(report: Report) -> str:
    lines = [
        "| model | load (s) | 1st request (s) | 2nd request (s) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for r in report["models"]:
        lines.append(
            f"| {_label(r)} | {r['load_s']:.2f} | {r['first_request_s']:.2f} "
            f"| {r['request_s']:.2f} |"
        )
    lines += [
        "",
        "One run of each, for orientation only. " + _run(report, "python bench/bench_models.py"),
    ]
    return "\n".join(lines)


# ---- README ---------------------------------------------------------------------------
def readme_figures(gw: Report, stack: Report) -> str:
    a = gw["added"]["accelmux"]["chat"]
    lines = [
        f"- The gateway adds {a['p50_ms']:.2f} ms at the median and {a['p99_ms']:.2f} ms at "
        f"the p99 to a chat completion, and serves {a['rps_of_direct']:.0%} of the requests/s "
        f"of the upstream called directly ({gw['settings']['requests']:,} requests per "
        f"repeat, machine load average {_load_range(gw)}; docs/benchmarks.md, section 3)."
    ]
    prot = stack.get("protection", {})
    m, u = prot.get("accelmux"), prot.get("unmanaged")
    if m and u:
        n = min(m["alone"]["n"], m["loaded"]["n"], u["alone"]["n"], u["loaded"]["n"])
        what = "p95" if m["ratio_p95"] is not None and u["ratio_p95"] is not None else "p50"
        key = f"ratio_{what}"
        cpus = stack.get("meta", {}).get("machine", {}).get("cpus", "?")
        lines.append(
            f"- On the default stack (real models, {cpus} cores), the voice chain's {what} while a "
            f"batch job and two cameras run is {m[key]:.2f}x its {what} alone under accelmux "
            f"and {u[key]:.2f}x with the same models uncoordinated (at least {n} chains per "
            "phase; section 4)."
        )
    for row in stack.get("memory", []):
        if row["shared"].get("truth"):
            sh, sep = row["shared"]["pss_total_bytes"], row["separate"]["pss_total_bytes"]
            lines.append(
                f"- Hosting the {row['label']} in one shared worker takes {_mib(sh, 0)} MiB "
                f"(PSS) instead of {_mib(sep, 0)} MiB in one process per service."
            )
    lines += ["", _run(stack, "python bench/bench_stack.py").replace("Run:", "Stack run:")]
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[], str]] = {
    "bench-manager": lambda: manager(load("manager")),
    "bench-gateway": lambda: gateway(load("gateway")),
    "stack-memory": lambda: stack_memory(load("stack")),
    "stack-memory-truth": lambda: stack_truth(load("stack")),
    "stack-voice": lambda: stack_voice(load("stack")),
    "models-memory": lambda: models_memory(load("models")),
    "models-speed": lambda: models_speed(load("models")),
    "readme-figures": lambda: readme_figures(load("gateway"), load("stack")),
}
