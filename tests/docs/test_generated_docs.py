"""The docs' generated tables agree with the committed JSON they are rendered from."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import docgen  # noqa: E402


def test_every_generated_block_matches_its_json() -> None:
    problems = docgen.check()
    assert not problems, "\n".join(str(p) for p in problems)


def test_a_stale_block_is_found(tmp_path: Path) -> None:
    blocks = {"demo": lambda: "| a |\n|---|\n| 1 |"}
    text = "x\n<!-- generated: demo -->\nold\n<!-- end generated: demo -->\ny\n"
    new, unknown = docgen.render_text(text, blocks)
    assert unknown == []
    assert "| 1 |" in new and "old" not in new
    assert docgen.render_text(new, blocks)[0] == new


def test_an_unknown_block_is_reported() -> None:
    text = "<!-- generated: nobody -->\nx\n<!-- end generated: nobody -->\n"
    assert docgen.render_text(text, {})[1] == ["nobody"]


HEX40 = re.compile(r"[0-9a-f]{40}")


@pytest.mark.parametrize("path", sorted(docgen.RESULTS.glob("*.json")), ids=lambda p: p.name)
def test_every_result_records_its_commit_date_and_machine(path: Path) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    meta = data.get("meta", {})
    assert HEX40.fullmatch(str(meta.get("commit", ""))), f"{path.name} records no commit"
    assert meta.get("date"), f"{path.name} records no date"
    assert meta.get("machine"), f"{path.name} records no machine"


def test_the_benchmarks_of_the_docs_all_have_results() -> None:
    names = {p.name for p in docgen.RESULTS.glob("*.json")}
    assert {"gateway.json", "manager.json", "stack.json", "models.json"} <= names
