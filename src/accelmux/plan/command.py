"""``accelmux history show|export`` and ``accelmux plan`` (docs/plan.md).

Where the history is: ``--data-dir DIR`` (its ``history`` folder), else the
``server.data_dir`` of ``-c CONFIG``, else the default stack's data directory
(``$ACCELMUX_DATA_DIR``, else ``~/.local/share/accelmux``): the directory the daemon
that ran without ``-c`` wrote to.

Heavy modules are imported when a command runs (``# noqa: PLC0415``), not when the CLI
registers it, so ``accelmux --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from accelmux.errors import AccelmuxError

DURATION_UNITS = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
#: A plan replays at most this much of a longer history unless --last says otherwise.
DEFAULT_LAST_S = 86_400.0


def _where(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", help="the daemon's config (its server.data_dir)")
    p.add_argument("--data-dir", help="the daemon's data directory (default: see docs/plan.md)")
    p.add_argument("--run", help="which run of the daemon (default: the latest)")
    p.add_argument("--last", help="only the last DURATION of it, e.g. 2h, 90m (default: all)")


def register(sub: Any) -> None:
    h = sub.add_parser(
        "history",
        help="the request history the daemon records: show it, export it",
        description="The daemon records every request's sizes, times and outcome (never "
        "its text), memory samples and loads, under DATA_DIR/history.",
    )
    hsub = h.add_subparsers(dest="history_command", metavar="COMMAND")
    show = hsub.add_parser("show", help="the runs recorded and the services' profiles")
    _where(show)
    show.set_defaults(func=run_show)
    export = hsub.add_parser(
        "export", help="write a scenario, a request trace and a device timeline"
    )
    _where(export)
    export.add_argument("--out", required=True, help="directory to write them to")
    export.set_defaults(func=run_export)
    h.set_defaults(func=lambda args: _usage(h))

    p = sub.add_parser(
        "plan",
        help="replay the history as recorded and with a change: size, services, policy",
        description="Replay the recorded history through the simulator with the same "
        "config, then with each change asked, and print them side by side (docs/plan.md).",
    )
    _where(p)
    p.add_argument("--scenario", help="plan from an exported scenario instead of a history")
    p.add_argument("--device-gib", help="the device's size in GiB; a list gives a column each")
    p.add_argument("--budget-gib", help="the device's budget in GiB; a list gives a column each")
    p.add_argument("--add-device-gib", type=float, help="a second device of this many GiB")
    p.add_argument("--compute-scale", type=float, help="every speed times this (a faster device)")
    p.add_argument(
        "--add-service",
        action="append",
        default=[],
        metavar="SPEC",
        help="name=NAME,gguf=FILE|catalogue=ENTRY[,kind=chat,class=interactive,"
        "rate_per_h=20,prompt_tokens=1000,output_tokens=200,...]",
    )
    p.add_argument("--remove-service", action="append", default=[], metavar="NAME")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SERVICE.FIELD=VALUE",
        help="e.g. indexer.windows=01:00-05:00, completion.class=batch",
    )
    p.add_argument(
        "--policy", help="replay the change with this policy (default: the recorded one)"
    )
    p.add_argument("--json", dest="json_path", help="write the plan as JSON here ('-': stdout)")
    p.set_defaults(func=run_plan)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h``, ``1d`` -> seconds."""
    raw = text.strip().lower()
    for unit in sorted(DURATION_UNITS, key=len, reverse=True):
        if raw.endswith(unit):
            number = raw[: -len(unit)]
            break
    else:
        number, unit = raw, "s"
    try:
        value = float(number) * DURATION_UNITS[unit]
    except ValueError:
        raise AccelmuxError(f"--last: {text!r} is not a duration (e.g. 90m, 2h)") from None
    if value <= 0:
        raise AccelmuxError(f"--last must be positive (got {text!r})")
    return value


def history_dir(args: argparse.Namespace) -> Path:
    if args.data_dir:
        return Path(args.data_dir).expanduser() / "history"
    if args.config:
        from accelmux.config.load import load_config  # noqa: PLC0415  # --help stays fast

        return Path(load_config(args.config).server.data_dir).expanduser() / "history"
    from accelmux.defaults.stack import default_data_dir  # noqa: PLC0415  # --help stays fast

    return default_data_dir() / "history"


def _history(args: argparse.Namespace) -> Any:
    from accelmux.history.store import read_history  # noqa: PLC0415  # --help stays fast

    history = read_history(history_dir(args), args.run)
    for problem in history.problems:
        print(f"accelmux: warning: {problem}", file=sys.stderr)
    return history


def run_show(args: argparse.Namespace) -> int:
    from accelmux.history.store import list_runs  # noqa: PLC0415  # --help stays fast
    from accelmux.plan.calibrate import calibrate  # noqa: PLC0415  # --help stays fast
    from accelmux.plan.export import export_note  # noqa: PLC0415  # --help stays fast

    runs, _ = list_runs(history_dir(args))
    print(f"{len(runs)} run(s) in {history_dir(args)}:")
    for s in runs:
        print(f"  {s.run}  accelmux {s.version}")
    history = _history(args)
    print(export_note(history))
    print("measured profiles (what a replay is calibrated with):")
    for name, p in calibrate(history).items():
        speed = (
            f"prefill {p.prefill_tps:.0f} tok/s, {p.tbt_s * 1000:.1f} ms/token"
            if p.tbt_s is not None and p.prefill_tps is not None
            else f"base {p.base_s * 1000:.1f} ms + {p.per_unit_s * 1000:.2f} ms/unit"
            if p.base_s is not None and p.per_unit_s is not None
            else "speed not measured"
        )
        share = f"share {p.share:.2f}" if p.share is not None else "share not measured"
        if p.weight is not None:
            share += f", slows others by {p.weight:.2f}"
        load = f"load {p.load_s:.2f} s" if p.load_s is not None else "no load measured"
        print(f"  {name:<14} {p.requests:>6} requests  {speed}; {share}; {load}")
    return 0


def run_export(args: argparse.Namespace) -> int:
    from accelmux.plan.export import export_history, export_note  # noqa: PLC0415  # --help stays fast

    history = _history(args)
    last = parse_duration(args.last) if args.last else None
    path = export_history(history, last_s=last).write(Path(args.out))
    print(export_note(history))
    print(f"wrote {path} (and requests.csv, timeline.csv beside it)")
    print(f"replay it: accelmux simulate {path} --policies accelmux")
    return 0


def _floats(text: str | None, what: str) -> list[float | None]:
    if not text:
        return [None]
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise AccelmuxError(f"{what} must be numbers (got {text!r})") from None


def changes_of(args: argparse.Namespace) -> list[Any]:
    """One change per device size and budget asked (the other flags in each); none when
    nothing was asked."""
    from accelmux.plan.changes import Change, NewService  # noqa: PLC0415  # --help stays fast

    sets = []
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise AccelmuxError(f"--set {item!r}: expected SERVICE.FIELD=VALUE")
        sets.append((key.strip(), value.strip()))
    common = {
        "add_device_gib": args.add_device_gib,
        "compute_scale": args.compute_scale,
        "add_services": tuple(NewService.parse(s) for s in args.add_service),
        "remove_services": tuple(args.remove_service),
        "sets": tuple(sets),
        "policy": args.policy,
    }
    out = []
    for size in _floats(args.device_gib, "--device-gib"):
        for budget in _floats(args.budget_gib, "--budget-gib"):
            change = Change(device_gib=size, budget_gib=budget, **common)
            if change.describe() != "as recorded":
                out.append(change)
    return out


def run_plan(args: argparse.Namespace) -> int:
    from accelmux.plan.engine import plan_from_history, plan_from_scenario  # noqa: PLC0415  # --help stays fast
    from accelmux.plan.report import text  # noqa: PLC0415  # --help stays fast

    changes = changes_of(args)
    if args.scenario:
        plan = plan_from_scenario(Path(args.scenario), changes)
    else:
        history = _history(args)
        last = parse_duration(args.last) if args.last else None
        if last is None and history.span_s > DEFAULT_LAST_S:
            last = DEFAULT_LAST_S
            print(
                f"accelmux: the history spans {history.span_s / 3600:.0f} h: planning from its "
                "last 24 h (--last chooses)",
                file=sys.stderr,
            )
        plan = plan_from_history(history, changes, last_s=last)
    if args.json_path == "-":
        print(json.dumps(plan.as_dict(), indent=1))
        return 0
    print(text(plan))
    if args.json_path:
        Path(args.json_path).write_text(
            json.dumps(plan.as_dict(), indent=1) + "\n", encoding="utf-8"
        )
        print(f"wrote {args.json_path}")
    return 0
