"""End-to-end: a headless Chromium drives the dashboard of a live daemon (fake backends)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from tests.ui.support import (
    chromium,
    live_daemon,
    need_browser,
    script_errors,
    stack_config,
    wait_until,
)

MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    need_browser()
    with chromium() as driver:
        yield driver


def _css(browser: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(browser.find_elements(By.CSS_SELECTOR, selector))


# The page redraws every second: read and click through one script call each, so no
# element reference goes stale between finding it and using it.
def _text(browser: Any, selector: str) -> str:
    js = "const e = document.querySelector(arguments[0]); return e ? e.innerText : '';"
    return str(browser.execute_script(js, selector))


def _attrs(browser: Any, selector: str, name: str) -> list[str]:
    js = (
        "return [...document.querySelectorAll(arguments[0])]"
        ".map(e => e.getAttribute(arguments[1]));"
    )
    return [str(v) for v in browser.execute_script(js, selector, name)]


def _count(browser: Any, selector: str) -> int:
    return int(
        browser.execute_script("return document.querySelectorAll(arguments[0]).length;", selector)
    )


def _click(browser: Any, selector: str) -> None:
    from selenium.common.exceptions import StaleElementReferenceException

    for _ in range(20):
        found = _css(browser, selector)
        if found:
            try:
                found[0].click()
                return
            except StaleElementReferenceException:
                continue
    raise AssertionError(f"nothing to click at {selector}")


def _row_state(browser: Any, name: str) -> str | None:
    states = _attrs(browser, f'#services tr[data-service="{name}"]', "data-state")
    return states[0] if states else None


def _open(browser: Any, url: str) -> None:
    browser.get(url + "/")
    wait_until(lambda: _count(browser, "#services tr[data-service]") == 6, what="services")


def test_page_shows_services_and_numbers_from_status(browser: Any) -> None:
    with live_daemon() as d:
        _open(browser, d.url)
        status = d.status()
        for svc in status["services"]:
            wait_until(lambda s=svc: _row_state(browser, s["name"]) == s["state"], what=svc["name"])
        names = _attrs(browser, "#services tr[data-service]", "data-service")
        assert names == [s["name"] for s in status["services"]]
        # chat: 2 GiB weights + 256 MiB runtime + 256 MiB KV floor
        assert _text(browser, '#services tr[data-service="chat"] td.mem').startswith("2.5 GiB")
        assert _text(browser, '#services tr[data-service="asr"] td.mem').startswith("364 MiB")
        assert "0 B / 256 MiB" in _text(browser, '#services tr[data-service="chat"] td.kv')
        assert _text(browser, '#services tr[data-service="chat"] td.running') == "0 / 2"
        # the batch size, where the status puts it (usage.batch_size), and its column shown
        for svc in status["services"]:
            cell = f'#services tr[data-service="{svc["name"]}"] td.col-batch'
            assert _text(browser, cell) == str(svc["usage"]["batch_size"]), svc["name"]
        assert "no-batch" not in (_attrs(browser, "#services", "class")[0] or "")
        assert "PIN" in _text(browser, '#services tr[data-service="asr"] td.state')
        facts = _text(browser, '#devices .device[data-device="gpu"] .facts')
        assert "capacity 8 GiB" in facts and "headroom 512 MiB" in facts
        dev = status["devices"][0]
        assert _text(browser, ".facts .avail") == _gib(dev["available_bytes"])
        # the stacked bar: one segment per service category, plus free and headroom
        titles = _attrs(browser, ".bar .seg", "title")
        assert "chat · weights: 2 GiB" in titles
        assert "chat · KV cache: 256 MiB" in titles
        assert any(t.startswith("headroom kept for transient peaks: 512 MiB") for t in titles)
        why = _text(browser, ".why")
        assert "idle loaded services (chat, asr, tts, detect)" in why
        # maintenance window of the batch service, the memory timeline, the jobs panel
        window = d.config["services"]["embeddings"]["windows"][0].replace("-", "\u2013")
        assert window in _text(browser, '#windows tr[data-window="embeddings"]')
        wait_until(lambda: _count(browser, "#timeline svg path"), what="timeline drawn")
        assert "No batch jobs." in _text(browser, "#jobs")
        assert _text(browser, "#conn") in ("live", "polling")
        # hovering the timeline reads out the memory of each service at that moment
        from selenium.webdriver.common.action_chains import ActionChains

        wait_until(lambda: _count(browser, "#timeline svg path") >= 2, what="two layers")
        svg = _css(browser, "#timeline .tl-device svg")[0]
        ActionChains(browser).move_to_element_with_offset(svg, 500, 0).perform()
        wait_until(lambda: "total" in _text(browser, "#tl-tip"), what="hover readout")
        assert "chat" in _text(browser, "#tl-tip")
        assert script_errors(browser) == []


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f}".rstrip("0").rstrip(".") + " GiB"


def test_page_follows_loads_and_unloads(browser: Any) -> None:
    with live_daemon() as d:
        _open(browser, d.url)
        assert _row_state(browser, "image") == "unloaded"
        status, _, _ = d.call(d.post("/admin/services/image/load"))
        assert status == 200
        wait_until(lambda: _row_state(browser, "image") == "loaded", what="image loaded")
        assert _text(browser, '#services tr[data-service="image"] td.mem').startswith("2.25 GiB")
        wait_until(
            lambda: "image" in _text(browser, '#decisions tr[data-action="load"]'),
            what="load decision in the log",
        )
        d.call(d.post("/admin/services/image/unload"))
        wait_until(lambda: _row_state(browser, "image") == "unloaded", what="image unloaded")
        assert _text(browser, '#services tr[data-service="image"] td.switches .loads') == "1"


def test_admin_actions_unload_pin_and_cancel_job(browser: Any) -> None:
    with live_daemon() as d:
        _open(browser, d.url)
        wait_until(lambda: _row_state(browser, "detect") == "loaded", what="detect loaded")
        _click(browser, '#services tr[data-service="detect"] button[data-op="unload"]')
        wait_until(lambda: d.service_state("detect") == "unloaded", what="daemon unloaded detect")
        wait_until(lambda: _row_state(browser, "detect") == "unloaded", what="page shows it")
        assert "unload detect: accepted" in _text(browser, "#toast")
        _click(browser, '#services tr[data-service="chat"] button[data-op="pin"]')
        wait_until(
            lambda: "PIN" in _text(browser, '#services tr[data-service="chat"] td.state'),
            what="chat pinned",
        )
        assert next(s for s in d.status()["services"] if s["name"] == "chat")["pinned"]
        # a batch job: listed with its progress, then cancelled from the page
        status, job, _ = d.call(
            d.post("/v1/jobs", json={"model": "embeddings", "inputs": ["a", "b", "c"]})
        )
        assert status == 200, job
        row = f'#jobs tr[data-job="{job["id"]}"]'
        wait_until(lambda: _count(browser, row), what="job listed")
        assert "0 / 3" in _text(browser, row)
        _click(browser, row + " button[data-cancel]")
        wait_until(lambda: _attrs(browser, row, "data-status") == ["cancelled"], what="cancelled")


def test_refused_request_shows_reason_and_explanation(browser: Any) -> None:
    cfg = stack_config()
    cfg["services"]["chat"]["backend"]["latency_s"] = 1.5
    with live_daemon(cfg) as d:
        _open(browser, d.url)
        body = {"model": "chat", "messages": MSG, "max_tokens": 8}

        async def provoke() -> tuple[Any, list[Any]]:
            running = [asyncio.create_task(d.post("/v1/chat/completions", json=body))]
            running.append(asyncio.create_task(d.post("/v1/chat/completions", json=body)))
            rt = d.runtime
            assert rt is not None
            while len(rt.manager.world.inflight) < 2:
                await asyncio.sleep(0.01)
            running.append(asyncio.create_task(d.post("/v1/chat/completions", json=body)))
            while not rt.manager.world.waiting:
                await asyncio.sleep(0.01)
            refused = await d.post("/v1/chat/completions", json=body)
            return refused, running

        (status, out, headers), running = d.call(provoke())
        try:
            _check_refusal(browser, status, out, headers)
        finally:
            d.call(_gather(running))


async def _gather(tasks: list[Any]) -> list[Any]:
    return list(await asyncio.gather(*tasks, return_exceptions=True))


def _check_refusal(browser: Any, status: int, out: Any, headers: Any) -> None:
    assert status == 429, out
    rid = headers["X-Request-Id"]
    row = f'#decisions tr[data-rid="{rid}"][data-action="reject"]'
    wait_until(lambda: _count(browser, row), what="rejection in the log")
    assert _attrs(browser, row, "data-reason") == ["queue_full"]
    _click(browser, row)
    wait_until(lambda: "queue_full" in _text(browser, "#explain"), what="explanation")
    assert rid in _text(browser, "#explain h3")
    assert _count(browser, "#explain li") >= 1
    # the request that had to wait is explained too
    queued = '#decisions tr[data-action="enqueue"][data-rid^="req-"]'
    wait_until(lambda: _count(browser, queued), what="queued request in the log")
    _click(browser, queued)
    wait_until(lambda: "concurrency_limit" in _text(browser, "#explain"), what="wait reason")
    # the filter keeps refusals and waits only
    _click(browser, '#filters button[data-filter="refusals"]')
    actions = set(_attrs(browser, "#decisions tr[data-action]", "data-action"))
    assert actions <= {"reject", "fail", "enqueue", "preempt"} and "reject" in actions


def test_admin_key_is_asked_for_and_sent(browser: Any) -> None:
    cfg = stack_config()
    cfg["server"]["admin_key"] = "ui-test-admin-key"
    with live_daemon(cfg) as d:
        browser.get(d.url + "/")
        browser.execute_script("sessionStorage.clear()")
        assert script_errors(browser) == []
        browser.get(d.url + "/")
        form = _css(browser, "#key-form")[0]
        wait_until(form.is_displayed, what="key field shown")
        wait_until(lambda: "admin key" in _text(browser, "#banner"), what="refusal banner")
        assert _count(browser, "#services tr[data-service]") == 0
        _css(browser, "#key")[0].send_keys("ui-test-admin-key")
        _css(browser, "#key-form button")[0].click()
        wait_until(lambda: _count(browser, "#services tr[data-service]") == 6, what="services")
        assert browser.execute_script("return sessionStorage.getItem('accelmux.adminKey')") == (
            "ui-test-admin-key"
        )
        wait_until(lambda: _text(browser, "#conn") == "live", what="decision stream with the key")
        browser.execute_script("sessionStorage.clear()")
        assert script_errors(browser) == []


def test_page_shows_objectives_met_per_service_and_class(browser: Any) -> None:
    config = stack_config()
    config["services"]["chat"]["slo"] = {"latency_s": 30}
    with live_daemon(config) as d:
        _open(browser, d.url)
        body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(2):
            status, _, _ = d.call(d.post("/v1/chat/completions", json=body))
            assert status == 200
        wait_until(
            lambda: _text(browser, '#services tr[data-service="chat"] td.slo') == "100%",
            what="chat's objectives met",
        )
        assert _text(browser, '#services tr[data-service="asr"] td.slo') == "\u2013"  # none yet
        assert "interactive 100%" in _text(browser, "#queues .slo-classes")
        assert script_errors(browser) == []
