"""The dependency picture of docs/architecture.md, rendered from the source itself.

Not from benchmark JSON like the other blocks: from the import graph of src/accelmux
(:mod:`import_graph`: module-level, ``TYPE_CHECKING`` and function-level imports). Each
package sits one layer above the highest layer it imports from, so every arrow points
down; ``scripts/gen-docs`` rewrites the block, and tests/docs fails when the doc and the
graph differ.
"""

from __future__ import annotations

from collections.abc import Callable

import import_graph as ig


def layers(graph: ig.Graph) -> list[list[str]]:
    """The packages by layer, bottom (imports nothing of accelmux) first.

    Raises on a cycle: then there is no picture to draw (tests/docs names the cycle)."""
    level: dict[str, int] = {}
    visiting: set[str] = set()

    def depth(node: str) -> int:
        if node in level:
            return level[node]
        if node in visiting:
            raise ValueError(f"import cycle through {node!r}")
        visiting.add(node)
        below = [depth(dep) for dep in graph.get(node, ())]
        visiting.discard(node)
        level[node] = 1 + max(below, default=-1)
        return level[node]

    for node in graph:
        depth(node)
    out: list[list[str]] = [[] for _ in range(1 + max(level.values(), default=-1))]
    for node, n in level.items():
        out[n].append(node)
    return [sorted(names) for names in out]


def _shown(package: str, packages: set[str]) -> str:
    """``core/`` for a package, ``cli.py`` for a top-level module."""
    if package == ig.PACKAGE:
        return "`__init__.py`"
    return f"`{package}/`" if package in packages else f"`{package}.py`"


def render() -> str:
    found = ig.imports()
    graph = ig.package_graph(found)
    packages = {
        ig.package_of(name)
        for name, path in ig.modules().items()
        if path.name == "__init__.py" and name.count(".") == 1
    }
    rows = ["| layer | package | imports |", "|---|---|---|"]
    stack = layers(graph)
    for n in range(len(stack) - 1, -1, -1):
        for package in stack[n]:
            deps = ", ".join(_shown(d, packages) for d in sorted(graph.get(package, ()))) or "-"
            rows.append(f"| {n} | {_shown(package, packages)} | {deps} |")
    return "\n".join(rows)


BLOCKS: dict[str, Callable[[], str]] = {"dependencies": render}
