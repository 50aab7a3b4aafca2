"""Render the generated blocks of the docs from committed benchmark JSON.

A doc marks each generated block with a pair of HTML comments::

    <!-- generated: NAME -->
    ...rendered Markdown, never edited by hand...
    <!-- end generated: NAME -->

Every module ``bench/render_*.py`` exposes ``BLOCKS: dict[str, Callable[[], str]]``, each
function returning the Markdown of one block from the JSON in ``bench/results`` (or
``docs/``; the dependency picture of docs/architecture.md from the source itself,
``render_dependencies.py``). ``scripts/gen-docs`` rewrites every block of README.md and docs/*.md;
``scripts/gen-docs --check`` (and ``tests/docs``) fails when a block differs from what
its JSON renders to, when a doc names a block no renderer knows, or when a renderer's
block appears in no doc. A block that shows a result measured under another policy than
today's ends with a line saying so (bench/freshness.py).
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"

_BLOCK = re.compile(
    r"(<!-- generated: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- end generated: (?P=name) -->)",
    re.S,
)


@dataclass(frozen=True)
class Problem:
    doc: Path
    block: str
    what: str

    def __str__(self) -> str:
        return f"{self.doc.relative_to(ROOT)}: block {self.block!r}: {self.what}"


def renderers() -> dict[str, Callable[[], str]]:
    """Every block name -> its render function, from the ``bench/render_*.py`` modules."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    found: dict[str, Callable[[], str]] = {}
    for path in sorted(BENCH.glob("render_*.py")):
        module = importlib.import_module(path.stem)
        for name, fn in module.BLOCKS.items():
            if name in found:
                raise ValueError(f"block {name!r} is rendered by two modules ({path.name})")
            found[name] = fn
    return found


def docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _body(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


def sources(fn: Callable[[], str]) -> tuple[str, list[Path]]:
    """What ``fn`` renders, and the result files under ``bench/results`` it read."""
    read: list[Path] = []
    real = Path.read_text

    def recording(self: Path, *args: Any, **kwargs: Any) -> str:
        if self.resolve().parent == RESULTS.resolve() and self not in read:
            read.append(self)
        return real(self, *args, **kwargs)

    Path.read_text = recording  # type: ignore[method-assign]
    try:
        text = fn()
    finally:
        Path.read_text = real  # type: ignore[method-assign]
    return text, read


def render_block(fn: Callable[[], str]) -> str:
    """A block as its renderer writes it, with a line for each stale result it shows
    (bench/freshness.py: measured under another policy than today's)."""
    import freshness  # bench/ is on sys.path (renderers())

    text, read = sources(fn)
    listed = freshness.listed_stale()
    notes = []
    for path in read:
        state = freshness.staleness(path.name)
        if state is not None and state.stale:
            notes.append(state.note(listed.get(path.name, "Not measured again yet.")))
    return _body(text) if not notes else _body(text.rstrip("\n") + "\n\n" + "\n\n".join(notes))


def render_text(text: str, blocks: dict[str, Callable[[], str]]) -> tuple[str, list[str]]:
    """``text`` with every known block re-rendered, and the names it had that are unknown."""
    unknown: list[str] = []

    def replace(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in blocks:
            unknown.append(name)
            return m.group(0)
        return m.group(1) + render_block(blocks[name]) + m.group(4)

    return _BLOCK.sub(replace, text), unknown


def check() -> list[Problem]:
    """What is out of step between the docs and the JSON (empty when all agree)."""
    blocks = renderers()
    problems: list[Problem] = []
    used: set[str] = set()
    for doc in docs():
        text = doc.read_text(encoding="utf-8")
        for m in _BLOCK.finditer(text):
            name = m.group("name")
            used.add(name)
            if name not in blocks:
                problems.append(Problem(doc, name, "no renderer knows it"))
            elif m.group("body") != render_block(blocks[name]):
                problems.append(Problem(doc, name, "differs from its JSON: run scripts/gen-docs"))
    for name in sorted(set(blocks) - used):
        problems.append(Problem(ROOT / "docs", name, "rendered but shown in no doc"))
    return problems


def write() -> list[Path]:
    """Rewrite every generated block; the docs that changed."""
    blocks = renderers()
    changed: list[Path] = []
    for doc in docs():
        text = doc.read_text(encoding="utf-8")
        new, unknown = render_text(text, blocks)
        if unknown:
            raise SystemExit(f"{doc}: unknown generated blocks {unknown}")
        if new != text:
            doc.write_text(new, encoding="utf-8")
            changed.append(doc)
    return changed
