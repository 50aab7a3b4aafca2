"""Tables of a comparison: plain text for the terminal, markdown for docs."""

from __future__ import annotations

from typing import Any

COLUMNS = (
    "policy",
    "realtime",
    "interactive",
    "batch",
    "background",
    "voice e2e",
    "p50/p99 int (s)",  # p99 only from P99_MIN_SAMPLES responses per seed
    "OOMs",
    "OOM-broken",
    "rejected",
    "cold starts",
    "thrash",
    "batch in window",
    "max preempt",
    "starved s (max)",
    "smallest GiB",
)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100.0 * x:.1f}%"


def _num(x: float | None, digits: int = 1) -> str:
    if x is None:
        return "-"
    return f"{x:.{digits}f}" if x != int(x) else f"{int(x)}"


def _sec(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


#: The fewest response times per seed behind a p99 worth printing (fewer: "-").
P99_MIN_SAMPLES = 100


def response_samples(cls: dict[str, Any]) -> float:
    """Response times per seed behind a percentile: requests neither rejected nor failed."""
    return float(cls.get("requests", 0) - cls.get("rejected", 0) - cls.get("failed", 0))


def _p99(cls: dict[str, Any]) -> float | None:
    p99: float | None = cls.get("p99_s")
    return p99 if response_samples(cls) >= P99_MIN_SAMPLES else None


def rows(report: dict[str, Any]) -> list[list[str]]:
    out = []
    for name, r in report["results"].items():
        cls = r["classes"]

        def att(c: str, cls: dict[str, Any] = cls) -> str:
            return _pct((cls.get(c) or {}).get("slo_attainment"))

        inter = cls.get("interactive") or {}
        chains = r.get("chains") or {}
        voice: dict[str, Any] = next(iter(chains.values()), {}) if chains else {}
        smallest = r.get("smallest_device_gib")
        out.append(
            [
                name,
                att("realtime"),
                att("interactive"),
                att("batch"),
                att("background"),
                _pct(voice.get("slo_attainment")),
                f"{_sec(inter.get('p50_s'))}/{_sec(_p99(inter))}",
                _num(r["oom_events"]),
                _num(r["oom_broken_requests"]),
                _num(sum(r["rejections"].values())),
                _num(r["cold_starts"]),
                _num(r["thrash"]),
                _pct(r["batch_done_in_window"]),
                _num(r.get("max_preemptions_per_request")),
                _num(r.get("longest_starved_s")),
                "-" if smallest is None else f"{smallest:g}",
            ]
        )
    return out


def text_table(report: dict[str, Any]) -> str:
    body = rows(report)
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(COLUMNS)]
    lines = [
        "  ".join(h.ljust(w) for h, w in zip(COLUMNS, widths, strict=True)),
        "  ".join("-" * w for w in widths),
    ]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in body]
    return "\n".join(lines)


def markdown_table(report: dict[str, Any]) -> str:
    body = rows(report)
    lines = [
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---" for _ in COLUMNS) + "|",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def header(report: dict[str, Any]) -> str:
    err = report.get("estimate_error", {})
    return (
        f"scenario {report['scenario']}: {report['capacity_gib']:g} GiB, "
        f"{report['duration_s']:g} s simulated, {report['seeds']} seed(s) "
        f"(sweep {report['sweep_seeds']}), estimate error "
        f"{'on' if err.get('enabled') else 'off'} (request sigma "
        f"{err.get('request_sigma')}, tail {err.get('tail_probability')} x "
        f"{err.get('tail_factor')}); SLO attainment means over seeds; target "
        f"{100 * report['slo_target']:g}%"
    )
