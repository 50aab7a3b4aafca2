"""The ``accelmux`` command line.

Each subcommand lives in its own module, which exposes ``register(subparsers)`` and
keeps its heavy imports inside the handler, so ``accelmux --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from accelmux import __version__
from accelmux.errors import AccelmuxError, ConfigError

#: Modules that register subcommands, in the order ``--help`` lists them.
COMMAND_MODULES = (
    "accelmux.server.command",
    "accelmux.server.node_command",
    "accelmux.runtime.status_cli",
    "accelmux.runtime.top",
    "accelmux.sim.command",
    "accelmux.check",
    "accelmux.jobs.command",
    "accelmux.setup.command",
    "accelmux.service.command",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="accelmux",
        description="One resource manager for a home server's AI accelerator.",
    )
    parser.add_argument("--version", action="version", version=f"accelmux {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        code = func(args)
    except ConfigError as exc:
        print(f"accelmux: invalid configuration\n{exc}", file=sys.stderr)
        return 2
    except AccelmuxError as exc:
        print(f"accelmux: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return int(code or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
