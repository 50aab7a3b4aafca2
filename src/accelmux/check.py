"""``accelmux check FILE``: validate a config (or a scenario) and list every problem.

A config is also checked against this machine (:mod:`accelmux.config.machine`), for
what ``serve`` would refuse: a ``server.data_dir`` it cannot create or write (tried as
serve does, then removed again), an external backend's program that is not there, an
``nvidia`` device left to detection that NVML does not have, a non-loopback host
without API keys, a host device's budget above the RAM. A service without a
``backend`` is a problem too: ``serve`` refuses it (such a config is for the simulator
only).

An old spelling the config still reads (:mod:`accelmux.config.deprecated`) is named on
stderr with its key path and the new spelling; the file is still OK.

A file with a top-level ``workloads`` key is a simulator scenario: it is validated
against the scenario schema (the config keys plus ``workloads`` and ``simulation``),
and the trace files its workloads name must exist.

It sits above both :mod:`accelmux.config` and :mod:`accelmux.sim` (a scenario is a config
plus workloads); both are imported when the command runs (``# noqa: PLC0415``), so
``accelmux --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from accelmux.errors import ConfigError


def register(sub: Any) -> None:
    p = sub.add_parser("check", help="validate a config file and report every problem")
    p.add_argument("file", nargs="?", help="YAML config or scenario file")
    p.add_argument(
        "--reference", action="store_true", help="print the configuration reference (Markdown)"
    )
    p.set_defaults(func=run)


def _report(exc: Any) -> int:
    print(f"{exc.source}: {len(exc.problems)} problem(s)", file=sys.stderr)
    for problem in exc.problems:
        print(f"  - {problem}", file=sys.stderr)
    return 2


def _report_deprecations(path: Path, notices: tuple[str, ...]) -> None:
    """Old spellings still work; each is named with its key path and the new spelling."""
    for notice in notices:
        print(f"{path}: {notice}", file=sys.stderr)


def _report_offload(path: Path, warnings: list[str]) -> None:
    """A worker service on a GPU whose model will run on the CPU: why, and the fix (the
    file is still OK)."""
    for warning in warnings:
        print(f"{path}: warning: {warning}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from accelmux.config import load, machine, reference  # noqa: PLC0415  # --help stays fast
    from accelmux.config.offload import (  # noqa: PLC0415  # --help stays fast
        offload_problems,
        offload_warnings,
        shared_model_notes,
    )
    from accelmux.sim.baselines import register_baselines  # noqa: PLC0415  # --help stays fast

    register_baselines()  # policy.name may name one, run for comparison
    if args.reference:
        print(reference.render_reference(), end="")
        return 0
    if not args.file:
        print("accelmux check: give a FILE to validate (or --reference)", file=sys.stderr)
        return 2
    path = Path(args.file)
    try:
        data = load.parse_yaml(load.read_text(path), str(path))
        if isinstance(data, dict) and "workloads" in data:
            return _check_scenario(data, path)
        cfg = load.load_config_data(data, str(path), path.parent)
        problems = [*machine.missing_backends(cfg), *machine.machine_problems(cfg)]
        problems += _open_wyoming_problems(cfg)
        problems += offload_problems(cfg)
        if problems:
            raise ConfigError(str(path), problems)
    except ConfigError as exc:
        return _report(exc)
    _report_deprecations(path, cfg.deprecations)
    _report_offload(path, [*offload_warnings(cfg), *shared_model_notes(cfg)])
    print(f"{args.file}: OK ({len(cfg.devices)} device(s), {len(cfg.services)} service(s))")
    return 0


def _open_wyoming_problems(cfg: Any) -> list[str]:
    """What ``serve`` refuses: Wyoming (no authentication) off loopback without opt-in."""
    from accelmux.config.wyoming import open_network_problem  # noqa: PLC0415  # --help stays fast

    wy = cfg.server.wyoming
    if wy is None:
        return []
    why = open_network_problem(wy, allow_unauthenticated=cfg.server.allow_unauthenticated)
    return [] if why is None else [why]


def _check_scenario(data: dict[str, Any], path: Path) -> int:
    from accelmux.sim.scenario import (  # noqa: PLC0415  # --help stays fast
        load_scenario_data,
        trace_problems,
    )

    scn = load_scenario_data(data, str(path), path.parent.resolve())
    problems = trace_problems(scn)
    if problems:
        return _report(ConfigError(str(path), problems))
    cfg = scn.config
    _report_deprecations(path, cfg.deprecations)
    print(
        f"{path}: OK (scenario: {len(cfg.devices)} device(s), {len(cfg.services)} service(s), "
        f"{len(cfg.workloads)} workload(s))"
    )
    return 0
