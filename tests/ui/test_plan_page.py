"""The plan page in a real browser: it plans from the daemon's history and draws the
table and the memory over time; a plan that cannot be made says why."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.plan.support import home, record
from tests.ui.support import chromium, live_daemon, need_browser, script_errors, wait_until


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    need_browser()
    with chromium() as driver:
        yield driver


def _js(browser: Any, script: str, *args: Any) -> Any:
    return browser.execute_script(script, *args)


def _submit(browser: Any, **fields: str) -> None:
    _js(
        browser,
        "for (const [k, v] of Object.entries(arguments[0])) "
        "document.querySelector(`#plan-form [name=${k}]`).value = v;"
        "document.querySelector('#plan-run').click();",
        fields,
    )


def _table(browser: Any) -> list[list[str]]:
    rows = _js(
        browser,
        "return [...document.querySelectorAll('#plan-table tr')]"
        ".map(r => [...r.children].map(c => c.innerText.trim()));",
    )
    return [list(map(str, r)) for r in rows]


def test_the_plan_page_plans_from_the_daemons_history(browser: Any) -> None:
    with live_daemon() as d:
        record(home(), d.data_dir)
        browser.get(d.url + "/dashboard/plan.html")
        _submit(browser, budget_gib="2.5,4")
        wait_until(lambda: len(_table(browser)) > 5, timeout=120, what="the plan table")
        table = _table(browser)
        assert table[0][1:] == [
            "recorded",
            "replay accelmux",
            "budget 2.5 GiB accelmux",
            "budget 4 GiB accelmux",
        ]
        rows = {r[0]: r[1:] for r in table[1:]}
        assert rows["first to suffer"][2].startswith("chat at"), rows["first to suffer"]
        assert rows["gpu memory peak"][0].endswith("GiB")
        lines = _js(
            browser,
            "return [...document.querySelectorAll('#plan-memory polyline.mem-line')]"
            ".map(p => [p.dataset.column, p.getAttribute('points').split(' ').length]);",
        )
        assert [c for c, _ in lines] == ["recorded", "replay", "budget 2.5 GiB", "budget 4 GiB"]
        assert all(n > 50 for _, n in lines)
        _submit(browser, budget_gib="", device_gib="0.2")
        wait_until(
            lambda: (
                "no service fits"
                in _js(browser, "return document.querySelector('#plan-status').innerText")
            ),
            timeout=60,
            what="the refusal",
        )
        assert not script_errors(browser)


def test_the_plan_page_reads_a_plan_file(browser: Any, tmp_path: Path) -> None:
    from accelmux.history.store import read_history
    from accelmux.plan.changes import Change
    from accelmux.plan.engine import plan_from_history

    directory = record(home(), tmp_path)
    plan = plan_from_history(read_history(directory), [Change(device_gib=12)])
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.as_dict()))
    with live_daemon() as d:
        browser.get(d.url + "/dashboard/plan.html")
        browser.find_element("css selector", "#plan-file").send_keys(str(path))
        wait_until(lambda: len(_table(browser)) > 5, timeout=20, what="the plan table")
        assert _table(browser)[0][1:] == ["recorded", "replay accelmux", "12 GiB device accelmux"]
        assert not script_errors(browser)
