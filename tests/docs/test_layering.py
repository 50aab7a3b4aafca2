"""Dependencies point one way: no import cycle between packages or modules of accelmux.

The graph is read from the source (``bench/import_graph.py``): module-level imports,
``if TYPE_CHECKING:`` blocks and imports inside functions all count, so a function-local
import cannot hide a cycle. A function-local import is allowed only where it is worth
its cost, and says why on its line (``# noqa: PLC0415  # <why>``): in the command
modules the CLI registers (so ``accelmux --help`` imports no daemon code), or for an
optional dependency that may be missing.
"""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import import_graph as ig  # noqa: E402
import render_dependencies  # noqa: E402

from accelmux.cli import COMMAND_MODULES  # noqa: E402

ARCHITECTURE = ROOT / "docs" / "architecture.md"
BLOCK = re.compile(
    r"<!-- generated: dependencies -->\n(?P<body>.*?)<!-- end generated: dependencies -->", re.S
)

#: Optional dependencies a function may import where it needs them: absent from some
#: Python builds (curses) or not installed everywhere (uvloop, and Ray: the cluster extra).
OPTIONAL_DEPENDENCIES = frozenset({"curses", "uvloop", "ray"})
WHY = re.compile(r"#\s*noqa:\s*PLC0415\s+#\s*(?P<why>\S.{9,})")


@functools.cache
def _imports() -> tuple[ig.Import, ...]:
    """The tree's imports, read once per test process (parsing every module takes seconds)."""
    return tuple(ig.imports())


def _pairs(cycle: list[str], found: list[ig.Import]) -> list[str]:
    return [line for a in cycle for b in cycle if a != b for line in ig.edges_between(found, a, b)]


def test_no_import_cycle_between_packages() -> None:
    found = list(_imports())
    graph = ig.package_graph(found)
    assert {"core", "config", "runtime", "gateway", "backends", "sim"} <= set(graph)
    problems = {" <-> ".join(c): _pairs(c, found) for c in ig.cycles(graph)}
    assert problems == {}


def test_no_import_cycle_between_modules() -> None:
    assert ig.cycles(ig.module_graph(list(_imports()))) == []


def local_import_problems(found: list[ig.Import], command_modules: set[str]) -> list[str]:
    problems = []
    for imp in found:
        if not imp.local:
            continue
        where = f"{imp.module}:{imp.line} imports {imp.target} in a function"
        allowed = imp.module in command_modules or (
            imp.target.split(".")[0] in OPTIONAL_DEPENDENCIES
        )
        if not allowed:
            problems.append(f"{where}: import it at the top of the module")
        elif WHY.search(imp.comment) is None:
            problems.append(f"{where}: say why on its line (# noqa: PLC0415  # <why>)")
    return problems


def test_function_local_imports_are_only_the_justified_ones() -> None:
    assert local_import_problems(list(_imports()), set(COMMAND_MODULES)) == []


SOURCE = """\
from __future__ import annotations
from typing import TYPE_CHECKING
from . import sibling
from ..other.deep import Thing
if TYPE_CHECKING:
    from accelmux.pkg.typed import T
def later():
    import curses  # noqa: PLC0415  # missing from some Python builds
    from accelmux.third import helper
"""


def test_the_reader_sees_relative_type_only_and_function_level_imports() -> None:
    known = ["accelmux.pkg.mod", "accelmux.pkg.sibling", "accelmux.other.deep"]
    known += ["accelmux.pkg.typed", "accelmux.third"]
    found = ig.imports_of(SOURCE, "accelmux.pkg.mod", False, known)
    own = [(i.target, i.local) for i in found if i.own]
    assert own == [
        ("accelmux.pkg.sibling", False),
        ("accelmux.other.deep", False),
        ("accelmux.pkg.typed", False),
        ("accelmux.third", True),
    ]
    assert ig.package_graph(found) == {"pkg": {"other", "third"}}
    problems = local_import_problems(found, set())
    assert problems == [
        "accelmux.pkg.mod:9 imports accelmux.third in a function: import it at the top of "
        "the module"
    ]
    bare = [ig.Import("accelmux.cmd", 3, "accelmux.core", True, "# noqa: PLC0415")]
    assert "say why" in local_import_problems(bare, {"accelmux.cmd"})[0]


def test_a_cycle_is_found_and_named() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert ig.cycles(graph) == [["a", "b", "c"]]
    found = [
        ig.Import("accelmux.a.x", 1, "accelmux.b.y", False, ""),
        ig.Import("accelmux.b.y", 7, "accelmux.a", True, ""),
    ]
    assert _pairs(["a", "b"], found) == [
        "accelmux.a.x:1 -> accelmux.b.y",
        "accelmux.b.y:7 -> accelmux.a (in a function)",
    ]


def test_the_dependency_picture_in_the_architecture_doc_is_the_graph() -> None:
    found = BLOCK.search(ARCHITECTURE.read_text(encoding="utf-8"))
    assert found is not None, "docs/architecture.md has no generated dependencies block"
    assert found.group("body") == render_dependencies.render() + "\n", (
        "docs/architecture.md's dependency picture is stale: run scripts/gen-docs"
    )


def test_every_arrow_of_the_picture_points_down() -> None:
    graph = ig.package_graph(list(_imports()))
    stack = render_dependencies.layers(graph)
    layer = {p: n for n, names in enumerate(stack) for p in names}
    assert all(layer[a] > layer[b] for a, deps in graph.items() for b in deps)
    # python -m accelmux (__main__) runs the CLI, which sits above every other package
    assert stack[-2:] == [["cli"], ["__main__"]]
    assert layer["server"] > layer["gateway"] > layer["runtime"]
    assert layer["runtime"] > layer["backends"] > layer["worker"] > layer["core"]


def test_layers_put_each_package_above_what_it_imports_and_refuse_a_cycle() -> None:
    graph = {"top": {"mid", "low"}, "mid": {"low"}, "side": {"low"}}
    assert render_dependencies.layers(graph) == [["low"], ["mid", "side"], ["top"]]
    with pytest.raises(ValueError, match="cycle"):
        render_dependencies.layers({"a": {"b"}, "b": {"a"}})


def test_the_cli_imports_its_command_modules_by_name() -> None:
    source = 'COMMAND_MODULES = (\n    "accelmux.pkg.command",\n)\n'
    found = ig.imports_of(source, "accelmux.cli", False, ["accelmux.pkg.command"])
    assert [(i.target, i.line, i.local) for i in found] == [("accelmux.pkg.command", 2, False)]
