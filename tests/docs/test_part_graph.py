"""The accelmux policy's parts form a graph without a cycle, and their build order is it.

The graph is read from the parts' constructors (``graph.part_graph``); ``scripts/part-graph``
prints it and docs/architecture.md carries it (a generated block).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from accelmux.core.policies.accelmux.graph import layers, part_graph
from accelmux.core.policies.accelmux.policy import Parts

ROOT = Path(__file__).resolve().parents[2]


def test_the_part_graph_has_no_cycle() -> None:
    stack = layers(part_graph())
    assert sum(len(layer) for layer in stack) == len(part_graph())


def test_a_cycle_fails_the_check() -> None:
    with pytest.raises(ValueError, match="cycle"):
        layers({"room": ("admission",), "admission": ("loading",), "loading": ("room",)})


def test_every_part_is_built_after_the_parts_it_takes() -> None:
    order = [f.name for f in dataclasses.fields(Parts) if f.name != "seam"]
    graph = part_graph()
    assert set(order) == set(graph)
    for name in order:
        assert all(order.index(dep) < order.index(name) for dep in graph[name]), name


def test_no_part_module_imports_a_part_above_it() -> None:
    """What the constructors say is all there is: a part module imports no part module
    of a layer at or above its own (facts, cache and records sit below every part)."""
    graph = part_graph()
    level = {name: n for n, names in enumerate(layers(graph)) for name in names}
    modules = {"residents": "residency"}
    src = ROOT / "src" / "accelmux" / "core" / "policies" / "accelmux"
    for name in graph:
        text = (src / f"{modules.get(name, name)}.py").read_text(encoding="utf-8")
        for other in graph:
            if other != name and level[other] >= level[name]:
                module = modules.get(other, other)
                assert f"accelmux.{module} import" not in text, (name, other)


def test_the_script_prints_the_graph() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "part-graph")],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert "| `schedule` |" in out.stdout and "`admission`" in out.stdout
