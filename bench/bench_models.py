"""Memory of every packaged model, each measured in a fresh Python process.

For each model (the two LLMs at n_ctx 2,048 and 8,192) a child interpreter imports the
runtime (its cost reported on its own), loads the model and serves two identical typical
requests, measuring RSS with the kernel's high-water mark (``/proc/self/clear_refs`` +
``VmHWM``), so short spikes count; the wrapper's ``memory_estimate()`` and, for the GGUF
models, the resident part of the estimate read from the GGUF header are recorded beside
the measurement. The measuring code is ``tests/real/measure_memory.py`` (the test
``tests/real/test_gguf.py`` holds the GGUF estimate to it); this script runs it for every
model and writes the result with its run metadata.

    .venv/bin/python bench/bench_models.py     # writes bench/results/models.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from meta import run_meta  # noqa: E402
from tests.real import measure_memory  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "models.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    t0 = time.monotonic()
    runs: list[dict[str, Any]] = []
    for name, n_ctx in measure_memory.RUNS:
        result = measure_memory.measure(name, n_ctx)
        runs.append(result)
        print(f"{name} n_ctx={n_ctx}: peak {result['peak'] / 2**20:.1f} MiB", flush=True)
    settings = {
        "runs": [list(r) for r in measure_memory.RUNS],
        "sentence": measure_memory.SENTENCE,
        "wall_s": round(time.monotonic() - t0, 1),
    }
    report = {"meta": run_meta(settings), "models": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
