"""The part graph of the accelmux policy, read from the parts' constructors.

A part depends on exactly the parts its constructor takes (each typed as the part's
class); :class:`~accelmux.core.policies.accelmux.policy.Parts` lists every part in the
order :func:`~accelmux.core.policies.accelmux.policy.build_parts` builds them. Every part
also stands on the seam (view, ops, cache) and on ``facts``, which depend on no part.
``scripts/part-graph`` prints :func:`render`; ``docs/architecture.md`` carries it
(``scripts/gen-docs``), and ``tests/docs/test_part_graph.py`` fails on a cycle.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterable, Mapping

from accelmux.core.policies.accelmux.policy import Parts

#: A part's name -> the names of the parts its constructor takes.
Graph = dict[str, tuple[str, ...]]


def part_graph() -> Graph:
    """Each part (by its field name in :class:`Parts`) and the parts it depends on."""
    hints = typing.get_type_hints(Parts)
    by_class = {hints[f.name]: f.name for f in dataclasses.fields(Parts) if f.name != "seam"}
    graph: Graph = {}
    for cls, name in by_class.items():
        takes = typing.get_type_hints(cls.__init__)
        graph[name] = tuple(
            by_class[t] for p, t in takes.items() if t in by_class and p != "return"
        )
    return graph


def layers(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The nodes of ``graph`` (each to the nodes it depends on) by layer, bottom first:
    each one layer above the highest it depends on (the parts here, the packages of
    ``bench/render_dependencies.py``).

    Raises ValueError naming a node on a cycle: then there is no order to build in."""
    level: dict[str, int] = {}
    visiting: set[str] = set()

    def depth(node: str) -> int:
        if node in level:
            return level[node]
        if node in visiting:
            raise ValueError(f"cycle through {node!r}")
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


def render() -> str:
    """The graph as a Markdown table, top layer first."""
    graph = part_graph()
    rows = ["| layer | part | takes |", "|---|---|---|"]
    stack = layers(graph)
    for n in range(len(stack) - 1, -1, -1):
        for name in stack[n]:
            deps = ", ".join(f"`{d}`" for d in sorted(graph[name])) or "-"
            rows.append(f"| {n} | `{name}` | {deps} |")
    rows.append("| - | `facts`, `cache`, `records` (the seam: view, ops, cache) | - |")
    return "\n".join(rows)
