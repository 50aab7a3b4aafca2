"""``accelmux setup [--check] [--llama-server]``: the default stack's models and runtimes.

``accelmux setup`` installs them (:func:`~.install.install`); ``--check`` says what is
missing; ``--llama-server`` builds llama.cpp's server instead (:func:`~.install.install_server`).

Exit status: 0 when everything is (now) in place; 1 when a step failed (the message
names the step and what to do) or, with ``--check``, when something is missing; 2 for
bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from accelmux.setup.install import check, install, install_server
from accelmux.setup.llama import Build, SetupError

HELP = "install the default stack's model runtimes and models into this Python environment"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--check",
        action="store_true",
        help="say what is installed and what is missing; install nothing (exit 1: missing)",
    )
    p.add_argument(
        "--llama-server",
        action="store_true",
        help="build llama.cpp's llama-server (for an external server) in the same build tree "
        "instead of installing the models, and print its path on the last line; with "
        "--check, check it too",
    )
    p.add_argument(
        "--cache",
        type=Path,
        help="where the llama.cpp build tree and wheel are kept "
        "(default: $ACCELMUX_WHEEL_CACHE, else ~/.cache/accelmux-wheels)",
    )


def register(sub: Any) -> None:
    p = sub.add_parser("setup", help=HELP, description=HELP)
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        build = Build.from_environment(args.cache)
        if args.check:
            findings = check(build, server=args.llama_server)
            print(f"accelmux setup --check ({sys.executable}):")
            print("\n".join(f.line() for f in findings))
            missing = [f.what for f in findings if not f.ok]
            if missing:
                print(f"missing: {', '.join(missing)}; `accelmux setup` installs them")
                return 1
            return 0
        if args.llama_server:
            print(install_server(build), flush=True)
        else:
            install(build)
    except SetupError as exc:
        print(f"accelmux setup: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="accelmux setup", description=HELP)
    add_arguments(parser)
    return run(parser.parse_args(argv))
