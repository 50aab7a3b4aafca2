"""Prometheus metrics (prometheus-client), served on the admin side at ``/metrics``.

Gauges and decision counters are read from the Manager's snapshot at scrape time (one
source of truth); latency histograms are observed by the gateway. Labels carry service,
device, category, class, action and reason names only: never keys or request content.

The ``service`` label is the name clients use: the replicas of a service that runs on
several devices (``chat@gpu0``, ``chat@gpu1``) are exported as ``service="chat"``, told
apart by ``device`` where the metric has one, and added up where it has none (loaded
when any replica is; usage figures that are not amounts are the largest replica's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

#: Keys of a service's ``usage`` (see :func:`accelmux.runtime.status.service_usage`) that
#: ``accelmux_service_usage`` exports; weights, reserved and active are by category in
#: ``accelmux_service_memory_bytes``.
USAGE_QUANTITIES = (
    "kv_in_use_bytes",
    "kv_pool_bytes",
    "concurrency",
    "context_in_use_tokens",
    "batch_size",
    "busy_slots_per_decode",
    "switches_per_hour",
    "cold_start_s",
)
#: Usage quantities that add up over a service's replicas (the others: the largest).
ADDITIVE_USAGE = frozenset(
    {
        "kv_in_use_bytes",
        "kv_pool_bytes",
        "concurrency",
        "context_in_use_tokens",
        "switches_per_hour",
    }
)
#: Per-service counts that add up over a service's replicas.
SERVICE_COUNTS = ("inflight", "waiting", "cold_starts", "loads", "evictions", "crashes")
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class _SnapshotCollector(Collector):
    def __init__(self, status: Callable[[], dict[str, Any]]) -> None:
        self._status = status

    def collect(self) -> Iterable[Metric]:
        snap = self._status()
        est = GaugeMetricFamily(
            "accelmux_service_memory_bytes",
            "Ledger bytes per service and category (estimated; reserved is measured).",
            labels=["service", "device", "category"],
        )
        measured = GaugeMetricFamily(
            "accelmux_service_measured_bytes",
            "Measured bytes per service (monitors).",
            labels=["service", "device"],
        )
        state = GaugeMetricFamily(
            "accelmux_service_loaded", "1 when the service is loaded.", labels=["service"]
        )
        inflight = GaugeMetricFamily(
            "accelmux_service_inflight", "Requests running per service.", labels=["service"]
        )
        waiting = GaugeMetricFamily(
            "accelmux_service_waiting", "Requests waiting per service.", labels=["service"]
        )
        cold = CounterMetricFamily(
            "accelmux_cold_starts", "Loads caused by demand or crash recovery.", labels=["service"]
        )
        loads = CounterMetricFamily("accelmux_loads", "Loads per service.", labels=["service"])
        evictions = CounterMetricFamily(
            "accelmux_evictions", "Evictions per service.", labels=["service"]
        )
        crashes = CounterMetricFamily("accelmux_crashes", "Backend crashes.", labels=["service"])
        usage = GaugeMetricFamily(
            "accelmux_service_usage",
            "Per service: kv_in_use_bytes, kv_pool_bytes, concurrency, context_in_use_tokens, "
            "batch_size, switches_per_hour, cold_start_s (measured; absent when unknown).",
            labels=["service", "quantity"],
        )
        for s in snap["services"]:
            name, dev = s.get("group") or s["name"], s["device"]
            for cat, n in s["ledger"].items():
                est.add_metric([name, dev, cat], n)
            if s.get("measured_bytes") is not None:
                measured.add_metric([name, dev], s["measured_bytes"])
        for name, s in by_group(snap["services"]).items():
            state.add_metric([name], 1.0 if s["state"] == "loaded" else 0.0)
            inflight.add_metric([name], s["inflight"])
            waiting.add_metric([name], s["waiting"])
            cold.add_metric([name], s["cold_starts"])
            loads.add_metric([name], s["loads"])
            evictions.add_metric([name], s["evictions"])
            crashes.add_metric([name], s["crashes"])
            for key in USAGE_QUANTITIES:
                value = (s.get("usage") or {}).get(key)
                if value is not None:
                    usage.add_metric([name, key], float(value))
        yield from (est, measured, state, inflight, waiting, cold, loads, evictions, crashes)
        yield usage
        yield from _live_families(by_group(snap["services"]))
        yield from _slo_families(snap)

        dev_g = GaugeMetricFamily(
            "accelmux_device_bytes",
            "Per device: capacity, budget, headroom, foreign, committed, available.",
            labels=["device", "quantity"],
        )
        for d in snap["devices"]:
            for key in ("capacity", "budget", "headroom", "foreign", "committed", "available"):
                dev_g.add_metric([d["name"], key], d[f"{key}_bytes"])
        yield dev_g

        queues = GaugeMetricFamily(
            "accelmux_queue_length", "Waiting requests per class.", labels=["class"]
        )
        for cls, n in snap["queues"].items():
            queues.add_metric([cls], n)
        yield queues

        decisions = CounterMetricFamily(
            "accelmux_decisions", "Decisions by action and reason.", labels=["action", "reason"]
        )
        for key, n in snap["counts"].items():
            action, _, reason = key.partition(":")
            decisions.add_metric([action, reason], n)
        yield decisions


#: Live percentiles exported per service: (metric, help, usage key prefix).
LIVE_PERCENTILES = (
    ("accelmux_ttft_seconds", "Time to first token (streams; arrival to first chunk)", "ttft"),
    ("accelmux_tbt_seconds", "Time between tokens (gap between stream chunks)", "tbt"),
)


def _live_families(groups: dict[str, dict[str, Any]]) -> Iterable[Metric]:
    """TTFT and TBT p50/p95 over the gateway's sliding window (``quantile`` label, as a
    Prometheus summary has), context in use and batch size, per service."""
    for name, doc, key in LIVE_PERCENTILES:
        family = GaugeMetricFamily(
            name, f"{doc}, p50 and p95 over the last 5 minutes.", labels=["service", "quantile"]
        )
        for service, s in groups.items():
            usage = s.get("usage") or {}
            for quantile, suffix in (("0.5", "p50"), ("0.95", "p95")):
                value = usage.get(f"{key}_{suffix}_s")
                if value is not None:
                    family.add_metric([service, quantile], float(value))
        yield family
    for name, doc, key in (
        ("accelmux_context_in_use_tokens", "Context in use per service, tokens.", "context"),
        ("accelmux_batch_size", "Requests the service computes at once.", "batch"),
    ):
        gauge = GaugeMetricFamily(name, doc, labels=["service"])
        for service, s in groups.items():
            value = (s.get("usage") or {}).get(
                "context_in_use_tokens" if key == "context" else "batch_size"
            )
            if value is not None:
                gauge.add_metric([service], float(value))
        yield gauge


def _slo_families(snap: dict[str, Any]) -> Iterable[Metric]:
    """Attainment of the objectives over the last minutes (runtime/live_slo.py): per
    service and per class, with the requests judged in the window."""
    for label, doc, entries in (
        ("service", "per service", {s["group"]: s.get("slo") for s in snap["services"]}),
        ("class", "per class", snap.get("slo_classes") or {}),
    ):
        attainment = GaugeMetricFamily(
            f"accelmux_{label}_slo_attainment",
            f"Share of requests that met their objectives, {doc}, over the last minutes.",
            labels=[label],
        )
        requests = GaugeMetricFamily(
            f"accelmux_{label}_slo_requests",
            f"Requests judged against their objectives, {doc}, over the last minutes.",
            labels=[label],
        )
        for name, entry in sorted(entries.items()):
            if not entry:
                continue
            requests.add_metric([name], float(entry["requests"]))
            if entry["attainment"] is not None:
                attainment.add_metric([name], float(entry["attainment"]))
        yield attainment
        yield requests


def by_group(services: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The status entries of ``services`` merged per name clients use (``group``): an
    ordinary service as it is, a replicated one's replicas added up."""
    out: dict[str, dict[str, Any]] = {}
    for s in services:
        name = s.get("group") or s["name"]
        seen = out.get(name)
        out[name] = dict(s) if seen is None else _merged(seen, s)
    return out


def _merged(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two replicas' status entries as one: counts added, loaded when either is."""
    out = dict(a)
    for key in SERVICE_COUNTS:
        out[key] = a[key] + b[key]
    if b["state"] == "loaded":
        out["state"] = "loaded"
    usage = dict(a.get("usage") or {})
    for key, value in (b.get("usage") or {}).items():
        mine = usage.get(key)
        if mine is None or value is None:
            usage[key] = value if mine is None else mine
        elif key in ADDITIVE_USAGE:
            usage[key] = mine + value
        else:
            usage[key] = max(mine, value)
    out["usage"] = usage
    return out


class Metrics:
    def __init__(self, status: Callable[[], dict[str, Any]]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.latency = Histogram(
            "accelmux_request_seconds",
            "End-to-end request latency in the gateway (queueing + serving).",
            ["service", "endpoint", "outcome"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            "accelmux_queue_wait_seconds",
            "Time from arrival to dispatch.",
            ["service"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.load_seconds = Histogram(
            "accelmux_load_seconds",
            "Backend load (cold start) duration.",
            ["service", "outcome"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_SnapshotCollector(status))

    def render(self) -> bytes:
        return generate_latest(self.registry)
