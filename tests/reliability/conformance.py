"""One schemathesis run over the daemon's own ``/openapi.json``: every route but the
endless ``/admin/events`` stream, every check, every phase (examples, coverage, fuzzing,
stateful), a fixed seed and deterministic generation, a bounded number of examples.

What the run is told beyond the document is in :mod:`tests.reliability.schema_hooks`.
``tests/reliability/test_fuzz_schema.py`` runs it and wants no failure;
``bench/bench_conformance.py`` records its figures for docs/security.md.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.live.support import base_config

ROOT = Path(__file__).resolve().parents[2]
SEED = 20261206
MAX_EXAMPLES = 30
EXCLUDED = "/admin/events"  # an endless stream by design: tests/live covers it
TIMEOUT_S = 900
CONFIG = Path(__file__).with_name("schemathesis.toml")


def daemon_config() -> dict[str, Any]:
    """The fake stack of the live tests (every kind of service), bodies up to 2 MiB."""
    cfg = base_config()
    cfg["server"].update({"max_body": "2MiB"})
    return cfg


@dataclass(frozen=True, slots=True)
class Conformance:
    returncode: int
    cases: int
    failures: int
    operations: int
    #: Operations in the served document (schemathesis's count).
    documented: int
    output: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "cases": self.cases,
            "failures": self.failures,
            "operations": self.operations,
            "documented": self.documented,
            "returncode": self.returncode,
        }


def command(url: str) -> list[str]:
    schemathesis = Path(sys.executable).with_name("schemathesis")
    return [
        str(schemathesis),
        "--config-file",
        str(CONFIG),
        "run",
        f"{url}/openapi.json",
        "--checks",
        "all",
        # replaced by positive_data_accepted (schema_hooks): see there
        "--exclude-checks",
        "positive_data_acceptance",
        "--seed",
        str(SEED),
        "--generation-deterministic",
        "--max-examples",
        str(MAX_EXAMPLES),
        "--exclude-path",
        EXCLUDED,
        "--no-color",
    ]


def run(url: str) -> Conformance:
    env = dict(
        os.environ,
        SCHEMATHESIS_HOOKS="tests.reliability.schema_hooks",
        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "src")]),
    )
    with tempfile.TemporaryDirectory(prefix="accelmux-schemathesis-") as cwd:
        # schemathesis keeps a cache of what it found in its working directory
        done = subprocess.run(
            command(url),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env=env,
            cwd=cwd,
            check=False,
        )
    out = done.stdout + done.stderr
    generated = re.search(r"(\d+) generated", out)
    found = re.search(r"(\d+) found", out)
    tested = re.search(r"Tested: (\d+)", out)
    selected = re.search(r"Selected: \d+/(\d+)", out)
    return Conformance(
        returncode=done.returncode,
        cases=int(generated.group(1)) if generated else 0,
        failures=int(found.group(1)) if found else 0,
        operations=int(tested.group(1)) if tested else 0,
        documented=int(selected.group(1)) if selected else 0,
        output=out,
    )
