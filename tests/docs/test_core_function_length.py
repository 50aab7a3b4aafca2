"""No function or method in ``core/`` is over 60 lines, from its ``def`` to its last line.

A long function in the core is one a reader must hold whole to change a decision: split
it into helpers that each name one step (one method per kind of event, one view per
device and per service, one initialiser per group of state).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "src" / "accelmux" / "core"
MAX_LINES = 60


def long_functions(root: Path, limit: int) -> list[str]:
    """``path:line name (n lines)`` for every function under ``root`` over ``limit``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                end = node.end_lineno if node.end_lineno is not None else node.lineno
                lines = end - node.lineno + 1
                if lines > limit:
                    where = Path(root.name) / path.relative_to(root)
                    found.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_core_function_is_over_60_lines() -> None:
    offenders = long_functions(CORE, MAX_LINES)
    assert not offenders, f"functions over {MAX_LINES} lines in core/: " + "; ".join(offenders)


def test_the_check_sees_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "m.py").write_text(f"def long() -> None:\n{body}\n", encoding="utf-8")
    assert [line.split()[1] for line in long_functions(tmp_path, MAX_LINES)] == ["long"]
