"""The dashboard's Python side: the bounded memory history and the routes."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

import pytest
from tests.ui.support import live_daemon, stack_config, wait_until

from accelmux.dashboard import MemoryHistory


def _status(chat: int, foreign: int = 0) -> dict[str, Any]:
    return {
        "devices": [
            {
                "name": "gpu",
                "capacity_bytes": 100,
                "budget_bytes": 90,
                "headroom_bytes": 10,
                "foreign_bytes": foreign,
            }
        ],
        "services": [
            {"name": "chat", "device": "gpu", "ledger": {"weights": chat, "kv": 5}},
            {"name": "asr", "device": "gpu", "ledger": {"weights": 1}},
        ],
    }


def test_history_is_bounded_to_its_window() -> None:
    h = MemoryHistory(window_s=10, period_s=1)
    for t in range(100):
        assert h.record(_status(t), at=float(t))
    assert len(h) <= h.maxlen == 11
    samples = h.samples()
    assert samples[0].t >= 89 and samples[-1].t == 99
    assert samples[-1].services == {"chat": 104, "asr": 1}
    assert h.service_device == {"chat": "gpu", "asr": "gpu"}
    assert h.devices["gpu"]["budget_bytes"] == 90


def test_history_skips_samples_that_come_too_soon_and_answers_since() -> None:
    now = [1000.0]
    h = MemoryHistory(window_s=60, period_s=1, clock=lambda: now[0])
    assert h.record(_status(1, foreign=7))
    now[0] += 0.2
    assert not h.record(_status(2))
    now[0] += 1.0
    assert h.record(_status(3))
    out = h.as_dict(since=1000.0)
    assert [s["services"]["chat"] for s in out["samples"]] == [8]
    assert h.as_dict()["samples"][0]["foreign"] == {"gpu": 7}
    assert out["window_s"] == 60 and out["period_s"] == 1


def test_history_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        MemoryHistory(window_s=0)


def _get(url: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()


def test_routes_serve_the_page_static_files_and_history() -> None:
    with live_daemon() as d:
        status, ctype, body = _get(d.url + "/")
        assert status == 200 and ctype.startswith("text/html") and "accel<span>mux" in body
        for name, kind in (("dashboard.js", "javascript"), ("dashboard.css", "text/css")):
            status, ctype, _ = _get(f"{d.url}/dashboard/{name}")
            assert status == 200 and kind in ctype
        first = wait_until(lambda: d.call(d.get("/admin/history"))["samples"], what="samples")
        out = d.call(d.get("/admin/history"))
        assert out["service_device"]["chat"] == "gpu"
        assert set(first[-1]["services"]) == {
            "chat",
            "embeddings",
            "image",
            "asr",
            "tts",
            "detect",
        }
        since = out["samples"][-1]["t"]
        later = d.call(d.get(f"/admin/history?since={since}"))
        assert all(s["t"] > since for s in later["samples"])
        bad = d.call(d.post("/admin/history"))
        assert bad[0] == 405
        assert d.call(d.get("/admin/history?since=soon"))["error"]["param"] == "since"


def test_history_needs_the_admin_key_like_status() -> None:
    cfg = stack_config()
    cfg["server"]["admin_key"] = "k"
    with live_daemon(cfg) as d:
        assert _get(d.url + "/")[0] == 200
        try:
            _get(d.url + "/admin/history")
        except urllib.error.HTTPError as exc:
            assert exc.code == 401
            exc.close()
        else:
            raise AssertionError("history served without the admin key")
