"""``accelmux check FILE``: validate a config and list every problem."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("check", help="validate a config file and report every problem")
    p.add_argument("file", help="YAML config or scenario file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from accelmux.config.load import load_config
    from accelmux.errors import ConfigError

    try:
        cfg = load_config(args.file)
    except ConfigError as exc:
        print(f"{exc.source}: {len(exc.problems)} problem(s)", file=sys.stderr)
        for problem in exc.problems:
            print(f"  - {problem}", file=sys.stderr)
        return 2
    print(f"{args.file}: OK ({len(cfg.devices)} device(s), {len(cfg.services)} service(s))")
    return 0
