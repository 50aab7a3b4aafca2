"""docs/gpu.md's build timing and estimate for ``scripts/gpu-check``, from
``bench/results/llama_build.json`` (bench/bench_llama_build.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from docgen import RESULTS
from meta import meta_line

STEP_LABELS = {
    "sources": "llama-cpp-python sdist: download and unpack",
    "configure": "cmake configure (libraries and llama-server)",
    "compile": "one compile: libllama, libggml*, llama-server",
    "install_server": "llama-server and its libraries copied",
    "pack_wheel": "llama-cpp-python wheel packed around the libraries",
}


def _load() -> dict[str, Any]:
    return dict(json.loads((RESULTS / "llama_build.json").read_text(encoding="utf-8")))


def _range(values: list[float]) -> str:
    low, high = values
    return f"{low / 60:.1f}-{high / 60:.1f}"


def llama_build() -> str:
    report = _load()
    meta = report["meta"]
    machine = meta["machine"]
    est = report["estimate"]
    lines = [
        f"Measured here: the CPU build of the same tree, {machine['cpus']} cores "
        f"({machine['cpu']}), {meta['settings']['jobs']} jobs, load average "
        f"{machine['load_avg_1m']} before and {report['load_avg_1m_after']} after.",
        "",
        "| step (CPU build, measured) | seconds |",
        "| --- | ---: |",
    ]
    for key, label in STEP_LABELS.items():
        lines.append(f"| {label} | {report['steps_s'][key]:.1f} |")
    parts = ", ".join(f"{k} {v:.0f} s" for k, v in report["compile_by_part_s"].items())
    longest = report["longest_compiles"][0]
    lines += [
        "",
        f"ninja's log: {report['compile_edges']} compile and link steps, "
        f"{report['compile_sum_s']:.0f} s of compiling in all ({parts}); the longest, "
        f"`{longest['output']}`, {longest['s']:.0f} s.",
        "",
        "| on 16 cores with one GPU (estimate) | minutes |",
        "| --- | ---: |",
        f"| host compiles (measured sum / 16, at least the longest) | "
        f"{est['host_compile_s'] / 60:.1f} |",
        f"| CUDA compiles: {est['cuda_files']} `.cu` files for one architecture | "
        f"{_range(est['cuda_compile_s'])} |",
        f"| steps that do not scale with cores (measured) | {est['fixed_steps_s'] / 60:.1f} |",
        f"| build, host and CUDA compiles sharing the cores | {_range(est['build_s'])} |",
        f"| the check itself after the build | {_range(est['check_run_s'])} |",
        f"| **whole `scripts/gpu-check`** (target {est['target_s'] / 60:.0f} min) | "
        f"**{_range(est['total_s'])}** |",
        "",
        meta_line(meta),
    ]
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[], str]] = {"llama-build": llama_build}
