"""The docs' generated tables agree with the committed JSON they are rendered from."""

from __future__ import annotations

import sys
from pathlib import Path

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
