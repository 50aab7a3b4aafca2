"""Dependencies run one way: the modules that the gateway, the jobs API and the backends
share depend on none of them, and only the fake backend uses the fake's outputs."""

from __future__ import annotations

import ast
from pathlib import Path

import accelmux

SRC = Path(accelmux.__file__).parent
SHARED = ("openai_shapes.py", "request_validation.py")


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, absolute; ``from a.b import c`` gives ``a.b`` and
    ``a.b.c`` (``c`` may be a module)."""
    package = path.relative_to(SRC.parent).parts[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def test_the_shared_modules_import_nothing_of_accelmux() -> None:
    for name in SHARED:
        own = {m for m in _imports(SRC / name) if m.split(".")[0] == "accelmux"}
        assert not own, (name, own)


def test_only_the_fake_backend_uses_the_fake_outputs() -> None:
    users = {
        str(path.relative_to(SRC))
        for path in sorted(SRC.rglob("*.py"))
        if "accelmux.backends.fake_outputs" in _imports(path)
    }
    assert users == {"backends/fake.py"}


def test_the_real_backends_answer_in_the_shared_shapes() -> None:
    assert "accelmux.openai_shapes" in _imports(SRC / "worker" / "components.py")
    assert "accelmux.openai_shapes" in _imports(SRC / "backends" / "fake.py")
