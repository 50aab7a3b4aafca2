"""Time the llama.cpp build steps of ``scripts/gpu-check`` on this machine's CPU, and
estimate the whole check on a 16-core machine with one GPU.

``scripts/gpu-check`` builds ONE llama.cpp tree with CUDA for the Python bindings and
llama-server (scripts/llama-build.sh). No CUDA toolkit (nor GPU) is here, so this runs
the same steps, in the same order, on the same tree with the CPU flags only, in a fresh
cache (nothing reused): the sdist download and unpack, the configure, one compile of
libllama + llama-server, the server's install and the wheel packed around the libraries.
It records each step's wall time and, from ninja's log, every compile's own time.

The estimate for 16 cores (what ``docs/gpu.md`` shows) is a model, said as one:

* host compiles: the compile seconds measured here (their sum over ninja's log) spread
  over 16 cores, never less than the longest single compile (a compile does not split),
  at this machine's speed per core;
* CUDA compiles: the ``.cu`` files the CUDA build compiles for one architecture (counted
  here by the rules of ggml-cuda's CMakeLists: every ``*.cu``, the fattn-tile, fattn-mma,
  mmq and mmf instances, the fattn-vec instances of the default K/V type pairs) times a
  range of nvcc seconds per file and architecture (:data:`NVCC_S_PER_FILE`), over 16
  cores, never less than the slowest file (:data:`NVCC_SLOWEST_S`);
* the steps that do not scale with cores (download, configure, packing) as measured;
* the pip installs run while llama.cpp compiles (gpu-check starts them first) and the
  check itself (:data:`CHECK_RUN_S`) after it.

    flock /work/heavy.lock .venv/bin/python bench/bench_llama_build.py
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from meta import run_meta

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "llama_build.json"
TARGET_CORES = 16
TARGET_S = 8 * 60
#: nvcc seconds per .cu file for one architecture (low, high), one core. From published
#: figures, not measured here: llama.cpp's PR 13135 (GGML_NATIVE=OFF, all of llama.cpp,
#: 16C/32T Xeon E5-2683 v4: 406 s for ~5 architectures) and a CUDA CI report of 95
#: minutes for 124 .cu files x 7-8 architectures on 4 cores (~24 core-s per file and
#: architecture); the low end assumes a current CPU (about twice that speed).
NVCC_S_PER_FILE = (10.0, 25.0)
#: The slowest single .cu file for one architecture (mmq / fattn instances), seconds: a
#: floor on the CUDA part however many cores there are (PR 13135: the build "spends a
#: long time waiting for only 2 CUDA kernels").
NVCC_SLOWEST_S = (40.0, 90.0)
#: bench/gpu_check.py itself after the build: the stack's loads, the voice chain 20 times
#: alone and 20 times under load, the LLMs' streams (seconds, low and high).
CHECK_RUN_S = (90.0, 180.0)
#: ninja outputs -> the part of llama.cpp they belong to (first match wins).
PARTS = (
    ("ggml-cpu", re.compile(r"ggml-cpu")),
    ("ggml", re.compile(r"ggml")),
    ("llama", re.compile(r"^src/|libllama\.so")),
    ("common", re.compile(r"^common/|libllama-common")),
    ("server", re.compile(r"tools/server|llama-server|cpp-httplib")),
    ("mtmd", re.compile(r"tools/mtmd|libmtmd")),
)
STEPS = (
    ("sources", "llama_sources"),
    ("configure", 'llama_configure "${LLAMA_SERVER_FLAGS[@]}"'),
    ("compile", "llama_build llama llama-server"),
    ("install_server", 'llama_install_server "$CACHE/llama-server"'),
    ("pack_wheel", 'llama_pack_wheel "$CACHE/wheels" >/dev/null'),
)


def run_step(cache: Path, jobs: int, command: str) -> float:
    """Seconds one step of scripts/llama-build.sh took (sourced afresh, state on disk)."""
    script = (
        f'PY={sys.executable!s} CACHE="{cache}" LLAMA_VERSION='
        '"${ACCELMUX_LLAMA_CPP_VERSION:-0.3.36}"; '
        f"ACCELMUX_BUILD_JOBS={jobs}; . scripts/llama-build.sh; {command}"
    )
    started = time.perf_counter()
    done = subprocess.run(
        ["bash", "-c", f"set -euo pipefail; {script}"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{command} failed:\n{done.stderr[-4000:]}")
    return took


def ninja_edges(build: Path) -> list[tuple[str, float]]:
    """(output, seconds) of every edge in ninja's log (its last entry per output)."""
    log = build / ".ninja_log"
    if not log.is_file():
        return []
    edges: dict[str, float] = {}
    for line in log.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) >= 4:
            edges[fields[3]] = (int(fields[1]) - int(fields[0])) / 1000.0
    return sorted(edges.items(), key=lambda kv: -kv[1])


def part_of(output: str) -> str:
    for name, pattern in PARTS:
        if pattern.search(output):
            return name
    return "other"


def cuda_files(llama_src: Path) -> dict[str, int]:
    """The .cu files a CUDA build compiles for one architecture, by group, by the rules
    of ggml-cuda's CMakeLists (default options: the fattn-vec instances of the default
    K/V pairs only)."""
    cuda = llama_src / "ggml" / "src" / "ggml-cuda"
    inst = cuda / "template-instances"
    defaults = re.search(
        r'set\s*\(\s*GGML_CUDA_FA_QUANTS\s+"([^"]*)"',
        (llama_src / "ggml" / "CMakeLists.txt").read_text(encoding="utf-8"),
    )
    pairs = [p.strip() for p in (defaults.group(1) if defaults else "f16-f16").split(";")]
    vec = [p for p in inst.glob("fattn-vec*.cu") if any(p.stem.endswith("-" + x) for x in pairs)]
    return {
        "kernels": len(list(cuda.glob("*.cu"))),
        "fattn-tile": len(list(inst.glob("fattn-tile*.cu"))),
        "fattn-mma": len(list(inst.glob("fattn-mma*.cu"))),
        "mmq": len(list(inst.glob("mmq*.cu"))),
        "mmf": len(list(inst.glob("mmf*.cu"))),
        "fattn-vec (default K/V pairs)": len(vec),
    }


def estimate(steps: dict[str, float], edges: list[tuple[str, float]], cu: int) -> dict[str, Any]:
    """The 16-core estimate (seconds, low and high) from what was measured here."""
    compile_sum = sum(s for _, s in edges)
    longest = max((s for _, s in edges), default=0.0)
    host = max(longest, compile_sum / TARGET_CORES)
    fixed = sum(steps[k] for k in ("sources", "configure", "install_server", "pack_wheel"))
    cuda = tuple(
        max(slowest, cu * per_file / TARGET_CORES)
        for per_file, slowest in zip(NVCC_S_PER_FILE, NVCC_SLOWEST_S, strict=True)
    )
    # host and CUDA compiles share the cores: their sum over 16 cores, or the larger floor
    build = tuple(
        max(host, c, (compile_sum + cu * per_file) / TARGET_CORES) + fixed
        for c, per_file in zip(cuda, NVCC_S_PER_FILE, strict=True)
    )
    total = tuple(b + run for b, run in zip(build, CHECK_RUN_S, strict=True))
    return {
        "cores": TARGET_CORES,
        "host_compile_s": round(host, 1),
        "cuda_files": cu,
        "cuda_compile_s": [round(c, 1) for c in cuda],
        "fixed_steps_s": round(fixed, 1),
        "build_s": [round(b, 1) for b in build],
        "check_run_s": list(CHECK_RUN_S),
        "total_s": [round(t, 1) for t in total],
        "target_s": TARGET_S,
        "assumptions": {
            "nvcc_s_per_file_and_arch": list(NVCC_S_PER_FILE),
            "nvcc_slowest_file_s": list(NVCC_SLOWEST_S),
            "per_core_speed": "as this machine's",
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=0, help="compile jobs (default: nproc)")
    parser.add_argument("--keep", action="store_true", help="keep the build cache")
    args = parser.parse_args()
    jobs = args.jobs or len(os.sched_getaffinity(0))
    cache = Path(tempfile.mkdtemp(prefix="llama-build-bench-"))
    before = run_meta({"jobs": jobs, "flags": "CPU (the default of scripts/llama-build.sh)"})
    steps: dict[str, float] = {}
    try:
        for name, command in STEPS:
            steps[name] = round(run_step(cache, jobs, command), 1)
            print(f"{name}: {steps[name]:.1f} s", file=sys.stderr)
        tree = next(cache.glob("llama.cpp-*"))
        edges = ninja_edges(tree / "build")
        files = cuda_files(tree / "llama-cpp-python" / "vendor" / "llama.cpp")
    finally:
        if not args.keep:
            shutil.rmtree(cache, ignore_errors=True)
    parts: dict[str, float] = {}
    for output, seconds in edges:
        parts[part_of(output)] = parts.get(part_of(output), 0.0) + seconds
    report = {
        "meta": before,
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
        "steps_s": steps,
        "compile_edges": len(edges),
        "compile_sum_s": round(sum(s for _, s in edges), 1),
        "compile_by_part_s": {k: round(v, 1) for k, v in sorted(parts.items())},
        "longest_compiles": [{"output": o, "s": round(s, 1)} for o, s in edges[:5]],
        "cuda_files_by_group": files,
        "estimate": estimate(steps, edges, sum(files.values())),
    }
    OUT.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(report["estimate"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
