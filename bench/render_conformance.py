"""The generated block of docs/security.md for ``bench/results/conformance.json``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from docgen import RESULTS
from meta import meta_line


def _load() -> dict[str, Any]:
    return dict(json.loads((RESULTS / "conformance.json").read_text(encoding="utf-8")))


def conformance() -> str:
    report = _load()
    settings = report["meta"]["settings"]
    return (
        f"schemathesis over the served `/openapi.json`, every check and every phase "
        f"(examples, coverage, fuzzing, stateful): **{report['cases']} generated requests "
        f"on {report['operations']} operations, {report['failures']} failures**. Every "
        f"operation but `{settings['excluded']}` (an endless stream), up to "
        f"{settings['max_examples']} examples each, seed {settings['seed']}, deterministic "
        f"generation. Run: {meta_line(report['meta'])}; "
        "`python bench/bench_conformance.py` (the same run as "
        "`tests/reliability/test_fuzz_schema.py`)."
    )


BLOCKS: dict[str, Callable[[], str]] = {"conformance": conformance}
