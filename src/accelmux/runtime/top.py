"""``accelmux top``: a live terminal view of the daemon, like the web dashboard.

It polls ``/admin/status`` (and ``/v1/jobs`` when the daemon serves it) every
``--interval`` seconds and redraws with curses, so it works in any terminal, over SSH
too: per device a bar of the budget split by service (with foreign memory, headroom and
free space) and the sentence that says where the memory sits; per service its state,
class, residency, memory, requests running and waiting, KV in use and pool, loads,
evictions, thrash and cold starts; batch jobs, maintenance windows and the last
decisions with their reasons. ``q`` quits, ``r`` redraws now. Without a terminal (or
with ``--once``) it prints one frame and exits.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from accelmux.runtime.status_cli import DEFAULT_URL, human

#: One piece of a line: its text and a style name (see ``STYLES``).
Span = tuple[str, str]
Line = list[Span]

STYLES = ("plain", "dim", "bold", "title", "ok", "warn", "bad", "info", "svc0")
CATEGORIES = ("weights", "runtime", "kv", "active", "reserved", "leftover")
SERVICE_COLORS = 6


def register(sub: Any) -> None:
    p = sub.add_parser("top", help="live terminal view of memory, services and decisions")
    p.add_argument("--url", default=os.environ.get("ACCELMUX_URL", DEFAULT_URL))
    p.add_argument(
        "--admin-key",
        default=None,
        help="admin bearer key (default: $ACCELMUX_ADMIN_KEY; prefer the variable)",
    )
    p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.set_defaults(func=run)


# ---- fetching ----------------------------------------------------------------------------
class Unreachable(Exception):
    """The daemon did not answer (or answered an error)."""


def _get(url: str, key: str | None, timeout: float) -> Any:
    req = urllib.request.Request(url)
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.load(resp)


def fetch(base: str, key: str | None, timeout: float = 3.0) -> tuple[dict[str, Any], Any]:
    """``(status, jobs)``; jobs is None when the daemon serves no jobs API."""
    base = base.rstrip("/")
    try:
        status = _get(base + "/admin/status", key, timeout)
    except urllib.error.HTTPError as exc:
        hint = " (give --admin-key or $ACCELMUX_ADMIN_KEY)" if exc.code in (401, 403) else ""
        raise Unreachable(f"{base} answered {exc.code} {exc.reason}{hint}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise Unreachable(f"cannot reach {base}: {reason}") from None
    jobs: Any = None
    try:
        jobs = _get(base + "/v1/jobs?limit=5", key, timeout).get("data")
    except (urllib.error.URLError, OSError, ValueError, AttributeError):
        jobs = None
    return status, jobs


# ---- the frame (pure) --------------------------------------------------------------------
def _pad(text: str, width: int) -> str:
    return text[:width].ljust(width)


def letters(names: list[str]) -> dict[str, str]:
    """One distinct bar letter per service: its first free letter, else a digit."""
    taken: set[str] = set()
    out: dict[str, str] = {}
    for name in names:
        pick = next((c for c in name.upper() if c.isalnum() and c not in taken), None)
        if pick is None:
            pick = next(c for c in "0123456789?" if c not in taken or c == "?")
        taken.add(pick)
        out[name] = pick
    return out


def _bar(dev: dict[str, Any], parts_in: list[tuple[int, str, str]], width: int) -> Line:
    """The budget as ``width`` cells: one letter per service, o the workers' overhead,
    p the host park, # foreign, : headroom."""
    overhead = dev.get("overhead_bytes", 0)
    parked = dev.get("parked_bytes", 0)
    total = max(
        dev["capacity_bytes"],
        dev["committed_bytes"]
        + overhead
        + parked
        + dev["foreign_bytes"]
        + dev["headroom_bytes"]
        + max(0, dev["available_bytes"]),
        1,
    )
    parts = list(parts_in)
    parts.append((overhead, "o", "dim"))
    parts.append((parked, "p", "dim"))
    parts.append((dev["foreign_bytes"], "#", "dim"))
    parts.append((max(0, dev["available_bytes"]), ".", "dim"))
    parts.append((dev["headroom_bytes"], ":", "ok"))
    parts.append((max(0, dev["capacity_bytes"] - dev["budget_bytes"]), "x", "dim"))
    out: Line = [("[", "plain")]
    used = 0
    acc = 0
    for n, ch, style in parts:
        if n <= 0:
            continue
        acc += n
        cells = round(acc * width / total) - used
        if cells > 0:
            out.append((ch * cells, style))
            used += cells
    if used < width:
        out.append(("." * (width - used), "dim"))
    out.append(("]", "plain"))
    return out


def _why(dev: dict[str, Any], services: list[dict[str, Any]]) -> str:
    idle = [s for s in services if s["state"] == "loaded" and s["inflight"] == 0]
    idle_bytes = sum(sum(s["ledger"].get(c, 0) for c in CATEGORIES) for s in idle)
    running = sum(s["inflight"] for s in services)
    waiting = sum(s["waiting"] for s in services)
    kv_unused = sum(max(0, s["kv_pool_bytes"] - s["kv_in_use_bytes"]) for s in services)
    reserved = sum(s["ledger"].get("reserved", 0) for s in services)
    leftover = sum(s["ledger"].get("leftover", 0) for s in services)
    names = ", ".join(s["name"] for s in idle) or "none"
    extra = "".join(
        f"; {human(n)} {what}"
        for n, what in (
            (leftover, "left over by unloaded services"),
            (dev.get("overhead_bytes", 0), "workers' overhead"),
            (dev.get("parked_bytes", 0), "parked"),
        )
        if n > 0
    )
    return (
        f"{running} running, {waiting} waiting; {human(idle_bytes)} in idle loaded services "
        f"({names}); {human(kv_unused)} KV pool unused; {human(reserved)} allocator cache; "
        f"{human(dev['foreign_bytes'])} foreign{extra}"
    )


def _hhmm(seconds: float) -> str:
    s = int(seconds) % 86400
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}"


@dataclass
class View:
    url: str
    status: dict[str, Any] | None = None
    jobs: list[dict[str, Any]] | None = None
    error: str | None = None
    fetched_at: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


def frame(view: View, width: int, height: int) -> list[Line]:
    """The screen as lines of styled spans, at most ``height`` lines of ``width`` chars."""
    width = max(width, 40)
    lines: list[Line] = []
    st = view.status
    head: Line = [("accelmux top ", "title"), (view.url, "dim")]
    if st is not None:
        srv = st.get("server", {})
        head.append(
            (
                f"  v{srv.get('version', '?')}  policy {srv.get('policy', '?')}  "
                f"up {srv.get('uptime_s', 0):.0f}s  open {srv.get('open_requests', 0)}",
                "plain",
            )
        )
    head.append(("   q quit", "dim"))
    lines.append(head)
    if view.error:
        lines.append([(f"! {view.error} (retrying)", "bad")])
    if st is None:
        return [_clip(line, width) for line in lines[:height]]
    queues = "  ".join(f"{k} {v}" for k, v in st.get("queues", {}).items())
    lines.append([("queued: ", "dim"), (queues, "plain")])
    met = "  ".join(
        f"{cls} {_percent(entry.get('attainment'))}"
        for cls, entry in (st.get("slo_classes") or {}).items()
    )
    if met:
        window = next(iter(st["slo_classes"].values())).get("window_s", 0)
        lines.append([(f"objectives met (last {window / 60:g} min): ", "dim"), (met, "plain")])
    lines.append([])
    services_all = st["services"]
    index = {s["name"]: i for i, s in enumerate(services_all)}
    marks = letters([s["name"] for s in services_all])
    for dev in st["devices"]:
        svcs = [s for s in services_all if s.get("device") == dev["name"]]
        lines.append(
            [
                (f"{dev['name']} ", "bold"),
                (
                    f"({dev['kind']})  budget {human(dev['budget_bytes'])}  committed "
                    f"{human(dev['committed_bytes'])}  foreign {human(dev['foreign_bytes'])}  "
                    f"headroom {human(dev['headroom_bytes'])}  available "
                    f"{human(dev['available_bytes'])}",
                    "plain",
                ),
            ]
        )
        parts = [
            (sum(x["ledger"].get(c, 0) for c in CATEGORIES), marks[x["name"]], _svc_style(index, x))
            for x in svcs
        ]
        lines.append([("  ", "plain"), *_bar(dev, parts, max(10, width - 4))])
        why = textwrap.wrap(_why(dev, svcs), max(20, width - 8))
        for i, text in enumerate(why):
            lines.append([("  why: " if i == 0 else "       ", "info"), (text, "plain")])
        legend: Line = [("  ", "plain")]
        for s in svcs:
            legend.append((f"{marks[s['name']]}={s['name']} ", _svc_style(index, s)))
        legend.append(("o=overhead p=parked #=foreign .=free :=headroom", "dim"))
        lines.append(legend)
        lines.append([])
    cols = (
        ("SERVICE", 12),
        ("STATE", 10),
        ("PIN", 4),
        ("CLASS", 12),
        ("RESIDENCY", 10),
        ("MEMORY", 9),
        ("RUN", 6),
        ("WAIT", 5),
        ("KV used/pool", 18),
        ("LOADS", 6),
        ("EVICT", 6),
        ("THRASH", 7),
        ("COLD", 5),
        ("SERVED", 7),
        ("SLO", 6),
    )
    lines.append([("".join(_pad(h, w) for h, w in cols), "title")])
    for s in services_all:
        led = s["ledger"]
        kv = (
            f"{human(s['kv_in_use_bytes'])}/{human(s['kv_pool_bytes'])}"
            if s.get("kv_pool_bytes") or s.get("kv_ceiling_bytes")
            else "-"
        )
        state_style = {"loaded": "ok", "crashed": "bad", "unloaded": "dim"}.get(s["state"], "warn")
        cells = [
            (_pad(s["name"], 12), _svc_style(index, s)),
            (_pad(s["state"], 10), state_style),
            (_pad("pin" if s.get("pinned") else "", 4), "warn"),
            (_pad(s["class"], 12), "plain"),
            (_pad(s["residency"], 10), "plain"),
            (_pad(human(sum(led.get(c, 0) for c in CATEGORIES)), 9), "plain"),
            (_pad(f"{s['inflight']}/{s['concurrency']}", 6), "plain"),
            (_pad(str(s["waiting"]), 5), "warn" if s["waiting"] else "plain"),
            (_pad(kv, 18), "plain"),
            (_pad(str(s["loads"]), 6), "plain"),
            (_pad(str(s["evictions"]), 6), "plain"),
            (_pad(str(s["thrash"]), 7), "warn" if s["thrash"] else "plain"),
            (_pad(str(s["cold_starts"]), 5), "plain"),
            (_pad(str(s["served"]), 7), "plain"),
            (_pad(_percent((s.get("slo") or {}).get("attainment")), 6), _slo_style(s)),
        ]
        lines.append(cells)
    windowed = [s for s in services_all if s.get("windows")]
    if windowed:
        lines.append([])
        text = "  ".join(
            f"{s['name']} {','.join(f'{_hhmm(a)}-{_hhmm(b)}' for a, b in s['windows'])} "
            f"({'open' if s.get('in_window') else 'closed'})"
            for s in windowed
        )
        lines.append([("windows: ", "title"), (text, "plain")])
    if view.jobs:
        lines.append([])
        lines.append([("JOBS", "title")])
        for job in view.jobs:
            c = job.get("request_counts", {})
            total = max(1, int(c.get("total", 0)))
            done = int(c.get("completed", 0))
            filled = round(20 * done / total)
            lines.append(
                [
                    (f"  {job.get('id', '')[:24]:<25}{job.get('model', ''):<12}", "plain"),
                    (f"{job.get('status', ''):<10}", "info"),
                    ("#" * filled + "." * (20 - filled), "ok"),
                    (f" {done}/{c.get('total', 0)}  failed {c.get('failed', 0)}", "plain"),
                ]
            )
    decisions = st.get("decisions", [])
    room = height - len(lines) - 2
    if decisions and room > 0:
        lines.append([])
        lines.append([("LAST DECISIONS", "title")])
        now = float(st.get("time", 0.0))
        for d in reversed(decisions[-room:]):
            action = str(d.get("action", ""))
            style = {
                "reject": "bad",
                "fail": "bad",
                "enqueue": "warn",
                "preempt": "warn",
                "dispatch": "ok",
            }.get(action, "info")
            lines.append(
                [
                    (f"  {now - float(d.get('t', now)):6.1f}s ago ", "dim"),
                    (f"{action:<9}", style),
                    (f"{d.get('service', '') or '':<12} {d.get('reason', '') or '':<24}", "plain"),
                    (f"{d.get('request_id', '') or ''} {d.get('detail', '') or ''}", "dim"),
                ]
            )
    return [_clip(line, width) for line in lines[:height]]


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.0f}%"


def _slo_style(svc: dict[str, Any]) -> str:
    share = (svc.get("slo") or {}).get("attainment")
    if share is None:
        return "plain"
    return "ok" if share >= 0.99 else "warn" if share >= 0.9 else "bad"


def _svc_style(index: dict[str, int], svc: dict[str, Any]) -> str:
    return f"svc{index[svc['name']] % SERVICE_COLORS}"


def _clip(line: Line, width: int) -> Line:
    out: Line = []
    left = width
    for text, style in line:
        if left <= 0:
            break
        out.append((text[:left], style))
        left -= len(text[:left])
    return out


def plain(lines: list[Line]) -> str:
    return "\n".join("".join(text for text, _ in line).rstrip() for line in lines)


# ---- the loop ----------------------------------------------------------------------------
def _poller(view: View, key: str | None, interval: float, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            status, jobs = fetch(view.url, key)
        except Unreachable as exc:
            with view.lock:
                view.error = str(exc)
        else:
            with view.lock:
                view.status, view.jobs, view.error = status, jobs, None
                view.fetched_at = time.time()
        stop.wait(interval)


def _curses_main(stdscr: Any, view: View, key: str | None, interval: float) -> None:
    import curses  # noqa: PLC0415  # optional: missing from some Python builds

    curses.curs_set(0)
    stdscr.timeout(100)
    attrs = {"plain": curses.A_NORMAL, "dim": curses.A_DIM, "bold": curses.A_BOLD}
    attrs["title"] = curses.A_BOLD
    attrs.update({"ok": 0, "warn": curses.A_BOLD, "bad": curses.A_BOLD, "info": 0})
    if curses.has_colors():
        curses.start_color()
        with contextlib.suppress(curses.error):
            curses.use_default_colors()
        palette = [
            ("ok", curses.COLOR_GREEN),
            ("warn", curses.COLOR_YELLOW),
            ("bad", curses.COLOR_RED),
            ("info", curses.COLOR_CYAN),
            ("title", curses.COLOR_BLUE),
        ]
        services = [
            curses.COLOR_BLUE,
            curses.COLOR_YELLOW,
            curses.COLOR_GREEN,
            curses.COLOR_RED,
            curses.COLOR_MAGENTA,
            curses.COLOR_CYAN,
        ]
        pair = 1
        for name, colour in palette:
            curses.init_pair(pair, colour, -1)
            attrs[name] = curses.color_pair(pair) | (curses.A_BOLD if name != "info" else 0)
            pair += 1
        for i, colour in enumerate(services):
            curses.init_pair(pair, colour, -1)
            attrs[f"svc{i}"] = curses.color_pair(pair) | curses.A_BOLD
            pair += 1
    for i in range(SERVICE_COLORS):
        attrs.setdefault(f"svc{i}", curses.A_BOLD)
    stop = threading.Event()
    thread = threading.Thread(target=_poller, args=(view, key, interval, stop), daemon=True)
    thread.start()
    try:
        last_draw = 0.0
        while True:
            ch = stdscr.getch()
            if ch in (ord("q"), ord("Q"), 27):
                return
            now = time.monotonic()
            if ch == curses.KEY_RESIZE or ch == ord("r") or now - last_draw >= 0.25:
                last_draw = now
                height, width = stdscr.getmaxyx()
                with view.lock:
                    lines = frame(view, width - 1, height)
                stdscr.erase()
                for y, line in enumerate(lines):
                    x = 0
                    for text, style in line:
                        with contextlib.suppress(curses.error):
                            stdscr.addstr(y, x, text, attrs.get(style, 0))
                        x += len(text)
                stdscr.refresh()
    finally:
        stop.set()


def run(args: argparse.Namespace) -> int:
    key = args.admin_key or os.environ.get("ACCELMUX_ADMIN_KEY")
    if args.interval <= 0:
        print("accelmux top: --interval must be positive", file=sys.stderr)
        return 2
    view = View(url=args.url.rstrip("/"))
    try:
        view.status, view.jobs = fetch(view.url, key)
    except Unreachable as exc:
        print(f"accelmux top: {exc}", file=sys.stderr)
        return 1
    if args.once or not (sys.stdin.isatty() and sys.stdout.isatty()):
        size = os.get_terminal_size() if sys.stdout.isatty() else os.terminal_size((120, 60))
        print(plain(frame(view, size.columns, size.lines)))
        return 0
    import curses  # noqa: PLC0415  # optional: missing from some Python builds

    with contextlib.suppress(KeyboardInterrupt):
        curses.wrapper(_curses_main, view, key, args.interval)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m accelmux.runtime.top``: the same as ``accelmux top``."""
    parser = argparse.ArgumentParser(prog="accelmux")
    register(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(["top", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    sys.exit(main())
