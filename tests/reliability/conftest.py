"""The reliability suite records what each fault, load and bad-input case did.

Each test calls the ``record`` fixture once its assertions passed, with the case, what
must happen, what happened (measured figures included) and what was lost. When
``ACCELMUX_RELIABILITY_JSON`` names a file, the rows of the run are written there at the
end (``scripts/gen-reliability-doc`` does that, then renders ``docs/reliability.md``);
otherwise nothing is written, so an ordinary test run leaves the tree untouched.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROWS: list[dict[str, Any]] = []
_STARTED = time.time()

Record = Callable[..., None]


@pytest.fixture
def record(request: pytest.FixtureRequest) -> Record:
    def add(
        *, area: str, case: str, expected: str, happened: str, lost: str = "nothing", **figures: Any
    ) -> None:
        ROWS.append(
            {
                "area": area,
                "case": case,
                "expected": expected,
                "happened": happened,
                "lost": lost,
                "figures": figures,
                "test": request.node.nodeid,
            }
        )

    return add


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    target = os.environ.get("ACCELMUX_RELIABILITY_JSON")
    if not target or not ROWS:
        return
    rows = sorted(ROWS, key=lambda r: (r["area"], r["test"], r["case"]))
    doc = {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "duration_s": round(time.time() - _STARTED, 1),
        "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}",
        "exit_status": int(exitstatus),
        "rows": rows,
    }
    Path(target).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
