"""``accelmux service install|uninstall``: run the daemon as a systemd service.

``install`` renders the daemon's unit for this machine (:mod:`.daemon_unit`), writes it
with its environment drop-in, creates the ``accelmux`` system user (system units), and
enables and starts it; ``--user`` installs a unit of the calling user's service manager
instead; ``--print`` shows the files and changes nothing; ``--root DIR`` writes them
under DIR and runs nothing. ``uninstall`` stops, disables and removes the unit (the data
directory stays). docs/install.md explains the unit line by line.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

HELP = "install accelmux as a systemd service (hardened unit, journal, watchdog)"


def register(sub: Any) -> None:
    p = sub.add_parser("service", help=HELP, description=HELP)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    inst = actions.add_parser("install", help="write, enable and start the unit")
    inst.add_argument(
        "-c", "--config", help="the config file the service runs (default: the default stack)"
    )
    inst.add_argument(
        "--user",
        action="store_true",
        help="a unit of your own service manager (systemctl --user), run as you",
    )
    inst.add_argument(
        "--no-start", action="store_true", help="enable the unit, do not (re)start it"
    )
    inst.add_argument("--print", action="store_true", help="print the files; write nothing")
    inst.add_argument("--root", type=Path, help="write under this directory; run nothing")
    inst.set_defaults(func=install)
    rm = actions.add_parser("uninstall", help="stop, disable and remove the unit")
    rm.add_argument("--user", action="store_true", help="your own service manager's unit")
    rm.add_argument("--root", type=Path, help="remove from under this directory; run nothing")
    rm.add_argument("--keep-environment", action="store_true", help="keep the environment drop-in")
    rm.set_defaults(func=uninstall)


def install(args: argparse.Namespace) -> int:
    from accelmux.service import daemon_unit as du  # noqa: PLC0415  # --help stays fast
    from accelmux.service import install as inst  # noqa: PLC0415  # --help stays fast
    from accelmux.service.unit import render_environment_dropin as dropin  # noqa: PLC0415  # fast --help
    from accelmux.service.unit import render_unit  # noqa: PLC0415  # --help stays fast

    dry = bool(args.print or args.root)
    if not args.user and not dry and os.geteuid() != 0:
        print(
            "accelmux service install: a system unit needs root (sudo accelmux service "
            "install), or install your own with --user",
            file=sys.stderr,
        )
        return 2
    config = Path(args.config).absolute() if args.config else None
    unit, unreachable = inst.daemon_plan(config, user_mode=args.user, python=sys.executable)
    if unreachable is not None:
        if not dry:
            print(f"accelmux service install: {unreachable}", file=sys.stderr)
            return 1
        print(f"warning: {unreachable}", file=sys.stderr)
    if args.print:
        print(f"# {unit.file_name}\n{render_unit(unit)}")
        print(f"# {unit.file_name}.d/environment.conf\n{dropin(unit.name, [])}")
        if not args.user:
            print(f"# sysusers.d/{unit.name}.conf\n{du.sysusers_entry()}", end="")
        return 0
    placement = inst.Placement.of(user_mode=args.user, root=args.root)
    sysusers = None if args.user else du.sysusers_entry()
    for line in inst.install_units([unit], placement, sysusers, start=not args.no_start):
        print(line)
    return 0


def uninstall(args: argparse.Namespace) -> int:
    from accelmux.service import daemon_unit as du  # noqa: PLC0415  # --help stays fast
    from accelmux.service import install as inst  # noqa: PLC0415  # --help stays fast

    if not args.user and not args.root and os.geteuid() != 0:
        print("accelmux service uninstall: a system unit needs root", file=sys.stderr)
        return 2
    placement = inst.Placement.of(user_mode=args.user, root=args.root)
    removed = inst.remove_units(
        placement, [du.SERVICE_NAME], keep_environment=args.keep_environment
    )
    for path in removed:
        print(f"removed {path}")
    if not removed:
        print(f"no {du.SERVICE_NAME} unit in {placement.unit_dir}")
    return 0
