"""Doc blocks for the pause/park/resume benchmarks (``bench/results/pause.json`` and
``bench/results/pause_unload.json``)."""

from __future__ import annotations

from collections.abc import Callable

from render_bench import Report, _run, load

MIB = 2**20
HOW = {
    "cold_dropped": "cold, file dropped from the page cache",
    "cold_cached": "cold, file still in the page cache",
    "parked": "parked (`unload(tier=parked)`)",
}


def _ms(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms:.3f}" if ms < 1 else f"{ms:,.1f}"


def pause_sequences(report: Report) -> str:
    lines = [
        "| prompt + 8 tokens | pause (ms) | park: save (ms) | parked | resume: restore (ms) "
        "| evaluating them again (ms) | identical |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | :---: |",
    ]
    for r in report["sequences"]:
        lines.append(
            f"| {r['tokens']:,} tokens | {_ms(r['pause_s'])} | {_ms(r['park_s'])} "
            f"| {r['parked_bytes'] / MIB:,.1f} MiB | {_ms(r['restore_s'])} "
            f"| {_ms(r['recompute_s'])} | {'yes' if r['identical'] else '**no**'} |"
        )
    w = report["worker"]
    lines += [
        "",
        f"Through `WorkerBackend` and the worker process: a pause returns in "
        f"{_ms(w['pause'])} ms (it waits for the next token), a parked one in "
        f"{_ms(w['park'])} ms, a resume in {_ms(w['resume'])} ms, and the next chunk "
        f"follows the resume after {_ms(w['resume_to_chunk'])} ms (one token).",
        "",
        "SmolLM2 in one process, a 2,048-token context, sampled with a seed; medians over "
        f"{report['meta'].get('settings', {}).get('repeat', '?')} repeats; identical: the "
        "resumed stream gave the tokens of an unpaused one. "
        + _run(report, "python bench/bench_pause.py"),
    ]
    return "\n".join(lines)


def pause_loads(report: Report) -> str:
    lines = [
        "| model (file) | unloaded | in page cache before | load (s) | first request (s) |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for r in report["loads"]:
        lines.append(
            f"| {r['model']} ({r['file_bytes'] / MIB:,.0f} MiB) | {HOW.get(r['how'], r['how'])} "
            f"| {r['resident_before']:.0%} | {r['load_wall_s']:.2f} | {r['first_token_s']:.2f} |"
        )
    settings = report["meta"].get("settings", {})
    lines += [
        "",
        f"Medians over {settings.get('load_repeat', '?')} loads each, through "
        "`WorkerBackend` (load: the round trip; first request: one token). The model files "
        f"sit on {settings.get('model_filesystems', {}).get('smollm2', '?')} on a virtual "
        "disk. " + _run(report, "python bench/bench_pause.py"),
    ]
    return "\n".join(lines)


def pause_unload(report: Report) -> str:
    lines = [
        "| paused stream | kept over the unload | unload (ms) | load (ms) "
        "| resume: restore (ms) | evaluating them again (ms) | identical |",
        "| --- | ---: | ---: | ---: | ---: | ---: | :---: |",
    ]
    for r in report["sequences"]:
        what = f"{r['tokens']:,} tokens" + (", JSON schema" if r["schema"] else "")
        restore = _ms(r["restore_s"]) if r["restored"] else f"{_ms(r['restore_s'])} (recomputed)"
        lines.append(
            f"| {what} | {r['kept_bytes'] / MIB:,.1f} MiB | {_ms(r['unload_s'])} "
            f"| {_ms(r['load_s'])} | {restore} | {_ms(r['recompute_s'])} "
            f"| {'yes' if r['identical'] else '**no**'} |"
        )
    w = report["worker"]
    lines += [
        "",
        f"Through `WorkerBackend` and the worker process (a 1,024-token context): "
        f"`pause(park=True)` returns in {_ms(w['park'])} ms, `unload(tier=parked)` in "
        f"{_ms(w['unload'])} ms with {w['kept_bytes'] / MIB:,.1f} MiB kept for the stream, "
        f"`load` in {_ms(w['load'])} ms, `resume` in {_ms(w['resume'])} ms, and the next "
        f"chunk follows the resume after {_ms(w['resume_to_chunk'])} ms.",
        "",
        "SmolLM2 in one process, a 2,048-token context, sampled with a seed, parked after "
        f"8 tokens; medians over {report['meta'].get('settings', {}).get('repeat', '?')} "
        "repeats; identical: the resumed stream gave the tokens of an unpaused one. "
        + _run(report, "python bench/bench_pause_unload.py"),
    ]
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[], str]] = {
    "pause-sequences": lambda: pause_sequences(load("pause")),
    "pause-loads": lambda: pause_loads(load("pause")),
    "pause-unload": lambda: pause_unload(load("pause_unload")),
}
