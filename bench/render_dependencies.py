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

from accelmux.core.policies.accelmux.graph import layers


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
