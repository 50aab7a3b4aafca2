"""The import graph of ``src/accelmux``, read from the source (nothing is imported).

Every ``import`` statement counts: at module level, inside ``if TYPE_CHECKING:`` blocks
(a type-only cycle is still a cycle) and inside functions. A module belongs to the
package right below ``accelmux`` (``accelmux.core.policies.accelmux`` -> ``core``); a
top-level module is a package of its own (``accelmux.cli`` -> ``cli``, and
``accelmux/__init__.py`` -> ``accelmux``). The modules the CLI imports by name
(``COMMAND_MODULES`` in ``cli.py``) count as imports of ``cli.py``.

Used by ``tests/docs/test_layering.py`` (no cycle, function-local imports justified) and
``bench/render_dependencies.py`` (the picture in docs/architecture.md).
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = "accelmux"

Graph = dict[str, set[str]]
#: Module-level names whose tuple of module names a module imports by name (importlib).
IMPORTED_BY_NAME = frozenset({"COMMAND_MODULES"})
#: An import statement, and whether it sits inside a function.
Scoped = tuple[ast.Import | ast.ImportFrom, bool]


@dataclass(frozen=True)
class Import:
    """One imported module of one import statement."""

    module: str  #: the importing module (dotted)
    line: int
    target: str  #: the imported module: one of the tree's, or an outside one (dotted)
    local: bool  #: inside a function
    comment: str  #: the comment(s) on the statement's lines, '' when none

    @property
    def own(self) -> bool:
        return self.target == PACKAGE or self.target.startswith(PACKAGE + ".")


def modules(src: Path = SRC) -> dict[str, Path]:
    """Every module of the package, dotted name -> file."""
    out: dict[str, Path] = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _comments(source: str) -> dict[int, str]:
    found: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            found[tok.start[0]] = tok.string
    return found


def _scoped_imports(tree: ast.Module) -> Iterable[Scoped]:
    """Every import statement with whether it sits inside a function."""

    def walk(node: ast.AST, in_function: bool) -> Iterable[Scoped]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_function
            inside = in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            )
            yield from walk(child, inside)

    return walk(tree, False)


def imports_of(source: str, module: str, is_package: bool, known: Iterable[str]) -> list[Import]:
    """The imports of one module's ``source``; ``known``: the tree's module names."""
    names = set(known)
    comments = _comments(source)
    tree = ast.parse(source)
    out = _imported_by_name(tree, module)
    for node, local in _scoped_imports(tree):
        end = node.end_lineno or node.lineno
        comment = "  ".join(comments[n] for n in range(node.lineno, end + 1) if n in comments)
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.append(sub if sub in names else base)
        for name in dict.fromkeys(targets):
            target = name
            if target.startswith(PACKAGE + "."):
                while target not in names and "." in target:
                    target = target.rpartition(".")[0]  # a name from a module, not a module
            out.append(Import(module, node.lineno, target, local, comment))
    return out


def _imported_by_name(tree: ast.Module, module: str) -> list[Import]:
    """``COMMAND_MODULES = ("accelmux.x", ...)`` at module level: imports of each."""
    out: list[Import] = []
    for node in tree.body:
        if not isinstance(node, ast.Assign) or not isinstance(node.value, (ast.Tuple, ast.List)):
            continue
        if not any(isinstance(t, ast.Name) and t.id in IMPORTED_BY_NAME for t in node.targets):
            continue
        for elt in node.value.elts:
            if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                out.append(Import(module, elt.lineno, elt.value, False, "imported by name"))
    return out


def imports(src: Path = SRC) -> list[Import]:
    """Every import of every module of the tree."""
    mods = modules(src)
    out: list[Import] = []
    for name, path in mods.items():
        source = path.read_text(encoding="utf-8")
        out += imports_of(source, name, path.name == "__init__.py", mods)
    return out


def package_of(module: str) -> str:
    """``accelmux.core.state`` -> ``core``; ``accelmux.cli`` -> ``cli``; ``accelmux`` itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def module_graph(found: Iterable[Import]) -> Graph:
    graph: Graph = {}
    for imp in found:
        graph.setdefault(imp.module, set())
        if imp.own and imp.target != imp.module:
            graph[imp.module].add(imp.target)
    return graph


def package_graph(found: Iterable[Import]) -> Graph:
    graph: Graph = {}
    for imp in found:
        here = package_of(imp.module)
        graph.setdefault(here, set())
        if imp.own and package_of(imp.target) != here:
            graph[here].add(package_of(imp.target))
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def edges_between(found: Iterable[Import], a: str, b: str) -> list[str]:
    """Where package ``a`` imports package ``b``: ``module:line -> target`` lines."""
    return sorted(
        f"{imp.module}:{imp.line} -> {imp.target}{' (in a function)' if imp.local else ''}"
        for imp in found
        if imp.own and package_of(imp.module) == a and package_of(imp.target) == b
    )
