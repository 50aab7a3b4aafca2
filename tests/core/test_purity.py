"""The core is pure: no I/O, clock, OS, asyncio or randomness imports; only core and errors."""

from __future__ import annotations

import ast
from pathlib import Path

import accelmux.core

CORE = Path(accelmux.core.__file__).parent

FORBIDDEN = frozenset(
    {
        "os",
        "sys",
        "io",
        "time",
        "datetime",
        "asyncio",
        "socket",
        "subprocess",
        "threading",
        "multiprocessing",
        "pathlib",
        "shutil",
        "signal",
        "select",
        "selectors",
        "random",
        "urllib",
        "http",
        "logging",
        "tempfile",
        "glob",
        "psutil",
        "aiohttp",
        "pynvml",
        "sqlite3",
    }
)
ALLOWED_OWN = ("accelmux.core", "accelmux.errors")


def imported_modules(source: str, package: str) -> list[tuple[int, str]]:
    """Every module ``source`` imports, absolute, with its line.

    ``package`` is the package the file lives in, to resolve relative imports. For
    ``from pkg import name`` with a top-level ``pkg``, ``pkg.name`` is reported, since
    the name may be a submodule (``from accelmux import runtime``).
    """
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                module = f"{base}.{module}" if module else base
            if "." in module:
                found.append((node.lineno, module))
            else:
                found.extend((node.lineno, f"{module}.{alias.name}") for alias in node.names)
    return sorted(found)


def violations(source: str, package: str) -> list[str]:
    out = []
    for lineno, module in imported_modules(source, package):
        top = module.split(".")[0]
        own_ok = any(module == a or module.startswith(a + ".") for a in ALLOWED_OWN)
        if top in FORBIDDEN or (top == "accelmux" and not own_ok):
            out.append(f"line {lineno}: {module}")
    return out


def package_of(path: Path) -> str:
    return ".".join(path.relative_to(CORE.parent.parent).parts[:-1])


def core_files() -> list[Path]:
    return sorted(CORE.rglob("*.py"))


def test_core_has_the_expected_modules() -> None:
    names = {p.name for p in core_files()}
    assert {"manager.py", "ledger.py", "ops.py", "view.py", "policy.py", "room.py"} <= names
    assert package_of(CORE / "policies" / "accelmux" / "room.py") == (
        "accelmux.core.policies.accelmux"
    )


def test_core_imports_no_io_clock_os_or_randomness() -> None:
    problems = [
        f"{path.relative_to(CORE)} {v}"
        for path in core_files()
        for v in violations(path.read_text(encoding="utf-8"), package_of(path))
    ]
    assert problems == []


def test_the_checker_catches_forbidden_imports() -> None:
    source = (
        "import os\n"
        "from time import monotonic\n"
        "import asyncio.tasks\n"
        "from accelmux.runtime import driver\n"
        "from accelmux import sim, errors\n"
        "from ... import monitors\n"
        "from ..state import World\n"
        "from accelmux.core.types import GIB\n"
        "import json, math\n"
        "def later():\n"
        "    import random\n"
    )
    found = violations(source, "accelmux.core.policies")
    assert found == [
        "line 1: os",
        "line 2: time.monotonic",
        "line 3: asyncio.tasks",
        "line 4: accelmux.runtime",
        "line 5: accelmux.sim",
        "line 6: accelmux.monitors",
        "line 11: random",
    ]
