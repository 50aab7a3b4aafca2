"""The API document against the daemon: the schemathesis run of the test suite
(``tests/reliability/conformance.py``: every route but ``/admin/events``, every check and
phase, a fixed seed, deterministic generation), its figures recorded for docs/security.md.

    .venv/bin/python bench/bench_conformance.py   # writes bench/results/conformance.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from meta import run_meta  # noqa: E402
from tests.reliability import conformance  # noqa: E402
from tests.reliability.support import running, write_config  # noqa: E402

OUT = ROOT / "bench" / "results" / "conformance.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="accelmux-conformance-") as tmp:
        path = write_config(conformance.daemon_config(), Path(tmp))
        with running(path, log_name="conformance") as daemon:
            result = conformance.run(daemon.url)
    settings = {
        "seed": conformance.SEED,
        "max_examples": conformance.MAX_EXAMPLES,
        "excluded": conformance.EXCLUDED,
        "command": " ".join(conformance.command("URL")[1:]),
    }
    report = {"meta": run_meta(settings), **result.as_dict()}
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result.as_dict()))
    if result.failures or result.returncode:
        print(result.output[-6000:])
        raise SystemExit(1)


if __name__ == "__main__":
    main()
