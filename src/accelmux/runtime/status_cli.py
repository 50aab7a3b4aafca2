"""``accelmux status``: a plain-text view of ``/admin/status``.

It answers "why is memory full while compute is idle?" at a glance: per service the
ledger (weights, KV pool, active leases, reserved = measured above the estimate), what
was measured, whether anything runs; per device foreign memory and what is available;
then a diagnosis line and the last decisions with their reasons.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8600"


def register(sub: Any) -> None:
    p = sub.add_parser("status", help="show memory, services, queues and recent decisions")
    p.add_argument("--url", default=os.environ.get("ACCELMUX_URL", DEFAULT_URL))
    p.add_argument(
        "--admin-key",
        default=None,
        help="admin bearer key (default: $ACCELMUX_ADMIN_KEY; prefer the variable)",
    )
    p.add_argument("--json", action="store_true", help="print the raw JSON")
    p.add_argument("-n", "--decisions", type=int, default=12, help="decisions to show")
    p.add_argument(
        "-w", "--watch", type=float, metavar="SECONDS", help="redraw every SECONDS until Ctrl-C"
    )
    p.set_defaults(func=run)


def fetch(url: str, admin_key: str | None, timeout: float = 5.0) -> dict[str, Any]:
    req = urllib.request.Request(url.rstrip("/") + "/admin/status")
    if admin_key:
        req.add_header("Authorization", f"Bearer {admin_key}")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        data: dict[str, Any] = json.load(resp)
    return data


def run(args: argparse.Namespace) -> int:
    if args.watch:
        code = 0
        try:
            while True:
                print("\033[2J\033[H", end="")  # clear the terminal, cursor home
                code = _once(args)
                time.sleep(max(0.2, args.watch))
        except KeyboardInterrupt:
            return code
    return _once(args)


def _once(args: argparse.Namespace) -> int:
    key = args.admin_key or os.environ.get("ACCELMUX_ADMIN_KEY")
    try:
        data = fetch(args.url, key)
    except urllib.error.HTTPError as exc:
        print(f"accelmux status: {args.url} answered {exc.code} {exc.reason}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"accelmux status: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(render(data, decisions=args.decisions))
    return 0


def human(n: float | int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "K", "M", "G", "T"):
        if abs(value) < 1024 or unit == "T":
            if unit == "B":
                return f"{int(value)}B"
            return f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}T"


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    return "\n".join(lines)


def diagnose(data: dict[str, Any]) -> list[str]:
    """Plain sentences: where the memory sits while nothing (or little) runs."""
    out = []
    for dev in data["devices"]:
        name = dev["name"]
        services = [s for s in data["services"] if s["device"] == name]
        idle = [s for s in services if s["state"] == "loaded" and s["inflight"] == 0]
        idle_bytes = sum(sum(s["ledger"].values()) for s in idle)
        reserved = sum(s["ledger"].get("reserved", 0) for s in services)
        kv_unused = sum(max(0, s["kv_pool_bytes"] - s["kv_in_use_bytes"]) for s in services)
        running = sum(s["inflight"] for s in services)
        parts = [
            f"{name}: {running} request(s) running",
            f"{human(idle_bytes)} held by idle loaded services "
            f"({', '.join(s['name'] for s in idle) or 'none'})",
            f"{human(kv_unused)} of KV pools unused",
            f"{human(reserved)} reserved above estimates",
            f"{human(dev['foreign_bytes'])} foreign",
            f"{human(dev['headroom_bytes'])} headroom",
            f"{human(dev['available_bytes'])} available",
        ]
        out.append("; ".join(parts))
    return out


def uptime(seconds: float | None) -> str:
    """``3d 4h``, ``2h 5m``, ``4m 10s`` or ``12s``."""
    if seconds is None:
        return "?"
    s = int(seconds)
    days, hours, minutes = s // 86400, s % 86400 // 3600, s % 3600 // 60
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {s % 60}s" if minutes else f"{s}s"


def config_lines(config: dict[str, Any] | None) -> list[str]:
    """The config file the daemon runs, its SHA-256 (compare: ``sha256sum FILE``) and
    each old spelling it used."""
    if not config:
        return []
    digest = config.get("sha256") or "?"
    lines = [f"config {config.get('file') or '(built in code)'}  sha256 {digest}"]
    lines += [f"  deprecated: {notice}" for notice in config.get("deprecations") or []]
    return lines


def render(data: dict[str, Any], *, decisions: int = 12) -> str:
    srv = data.get("server", {})
    lines = [
        f"accelmux {srv.get('version', '?')}  policy {srv.get('policy', '?')}  "
        f"up {uptime(srv.get('uptime_s'))}  open requests {srv.get('open_requests', 0)}"
        + ("  STOPPING" if srv.get("stopping") else ""),
        *config_lines(srv.get("config")),
        "",
    ]
    dev_rows = []
    for d in data["devices"]:
        measured = d.get("measured") or {}
        dev_rows.append(
            [
                d["name"],
                d["kind"],
                human(d["capacity_bytes"]),
                human(d["budget_bytes"]),
                human(d["headroom_bytes"]),
                human(d["foreign_bytes"]),
                human(d["committed_bytes"]),
                human(d["available_bytes"]),
                human(measured.get("used_bytes")),
            ]
        )
    lines.append(
        table(
            [
                "DEVICE",
                "KIND",
                "CAPACITY",
                "BUDGET",
                "HEADROOM",
                "FOREIGN",
                "COMMITTED",
                "AVAILABLE",
                "USED(meas)",
            ],
            dev_rows,
        )
    )
    lines.append("")
    svc_rows = []
    for s in data["services"]:
        led = s["ledger"]
        svc_rows.append(
            [
                s["name"],
                s["state"] + (" *pin" if s.get("pinned") else ""),
                s["class"],
                human(led.get("weights", 0) + led.get("runtime", 0)),
                f"{human(s['kv_in_use_bytes'])}/{human(s['kv_pool_bytes'])}",
                human(led.get("active", 0)),
                human(led.get("reserved", 0)),
                human(s.get("measured_bytes")),
                f"{s['inflight']}/{s['concurrency']}",
                str(s["waiting"]),
                f"{s['loads']}/{s['cold_starts']}/{s['evictions']}/{s['crashes']}",
            ]
        )
    lines.append(
        table(
            [
                "SERVICE",
                "STATE",
                "CLASS",
                "WEIGHTS+RT",
                "KV used/pool",
                "ACTIVE",
                "RESERVED",
                "MEASURED",
                "RUN",
                "WAIT",
                "LOAD/COLD/EVICT/CRASH",
            ],
            svc_rows,
        )
    )
    limits = [f"  {s['name']}: {s['limit']}" for s in data["services"] if s.get("limit")]
    if limits:
        lines.append("")
        lines.append("limits of external servers:")
        lines.extend(limits)
    placed = [
        f"  {s['name']}: {s['accelerator']}" for s in data["services"] if s.get("accelerator")
    ]
    overhead = [
        f"  {d['name']}: {human(d['overhead_bytes'])} of inference-worker overhead"
        for d in data["devices"]
        if d.get("overhead_bytes")
    ]
    if placed or overhead:
        lines.append("")
        lines.append("where worker models run:")
        lines.extend(placed + overhead)
    lines.append("")
    queues = data.get("queues", {})
    lines.append("queues: " + "  ".join(f"{k} {v}" for k, v in queues.items()))
    lines.append("")
    lines.append("why:")
    lines.extend("  " + text for text in diagnose(data))
    recent = data.get("decisions", [])[-decisions:]
    if recent:
        lines.append("")
        lines.append("last decisions:")
        for d in recent:
            who = d.get("request_id") or ""
            detail = d.get("detail") or ""
            lines.append(
                f"  t={d['t']:.3f} {d['action']:<8} {d.get('service', ''):<12} "
                f"{d.get('reason', ''):<22} {who} {detail}".rstrip()
            )
    return "\n".join(lines)
