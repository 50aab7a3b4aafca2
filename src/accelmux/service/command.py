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
    inst.add_argument(
        "--node",
        metavar="NAME",
        help="cluster mode: this machine's Ray node and node agent NAME instead of the daemon "
        "(docs/cluster.md; -c is then the cluster's config)",
    )
    inst.add_argument(
        "--gateway", action="store_true", help="with --node: a cluster gateway on this machine too"
    )
    inst.add_argument(
        "--cluster", metavar="ADDRESS", help="with --node: the Ray head (default: cluster.address)"
    )
    inst.add_argument(
        "--token-file",
        type=Path,
        help="with --node: the cluster's token (default: ~/.ray/auth_token of the user who ran "
        "sudo); copied to a file of the service user's",
    )
    inst.add_argument(
        "--device-mib",
        type=int,
        help="with --node: the accelerator memory declared to Ray (default: the config's "
        "devices on this machine)",
    )
    inst.set_defaults(func=install)
    rm = actions.add_parser("uninstall", help="stop, disable and remove the unit")
    rm.add_argument("--user", action="store_true", help="your own service manager's unit")
    rm.add_argument("--root", type=Path, help="remove from under this directory; run nothing")
    rm.add_argument("--keep-environment", action="store_true", help="keep the environment drop-in")
    rm.add_argument(
        "--node", action="store_true", help="the cluster node's units (Ray, agent, gateway)"
    )
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
    if args.node is not None:
        return install_node(args, dry=dry)
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
    from accelmux.service import node_units as nu  # noqa: PLC0415  # --help stays fast

    if not args.user and not args.root and os.geteuid() != 0:
        print("accelmux service uninstall: a system unit needs root", file=sys.stderr)
        return 2
    placement = inst.Placement.of(user_mode=args.user, root=args.root)
    names = list(nu.NODE_UNITS) if args.node else [du.SERVICE_NAME]
    removed = inst.remove_units(placement, names, keep_environment=args.keep_environment)
    for path in removed:
        print(f"removed {path}")
    if not removed:
        print(f"no {' or '.join(names)} unit in {placement.unit_dir}")
    return 0


def install_node(args: argparse.Namespace, *, dry: bool) -> int:
    """``install --node NAME``: the units of one machine of a cluster and its token."""
    from accelmux.service import daemon_unit as du  # noqa: PLC0415  # --help stays fast
    from accelmux.service import install as inst  # noqa: PLC0415  # --help stays fast
    from accelmux.service import node_install as ni  # noqa: PLC0415  # --help stays fast
    from accelmux.service.unit import render_unit  # noqa: PLC0415  # --help stays fast

    if not args.config:
        print(
            "accelmux service install --node: give the cluster's config with -c FILE",
            file=sys.stderr,
        )
        return 2
    plan = ni.node_plan(
        Path(args.config).absolute(),
        args.node,
        python=sys.executable,
        user_mode=args.user,
        gateway=args.gateway,
        cluster=args.cluster,
        token_file=args.token_file,
        device_mib=args.device_mib,
    )
    if plan.unreachable is not None:
        if not dry:
            print(f"accelmux service install: {plan.unreachable}", file=sys.stderr)
            return 1
        print(f"warning: {plan.unreachable}", file=sys.stderr)
    token_dest = plan.options.token_file
    if args.print:
        for unit in plan.units:
            print(f"# {unit.file_name}\n{render_unit(unit)}")
        if not args.user:
            print(f"# sysusers.d/{du.SERVICE_USER}.conf\n{du.sysusers_entry()}")
            print(
                f"# the token: {plan.token_source} copied to {token_dest} "
                f"(mode 0600, owner {du.SERVICE_USER})"
            )
        return 0
    placement = inst.Placement.of(user_mode=args.user, root=args.root)
    lines = []
    if not args.user:
        sysusers = inst.write_sysusers(placement, du.SERVICE_USER, du.sysusers_entry())
        if sysusers is not None:
            lines.append(f"wrote {sysusers}")
            if placement.systemctl is not None:
                inst.create_user(sysusers)
        state = Path(du.STATE_DIR)
        dest = Path(token_dest)
        if args.root is not None:
            state, dest = (args.root / p.relative_to("/") for p in (state, dest))
        ni.install_token(plan.token, dest, owner=du.SERVICE_USER, base=state)
        lines.append(f"wrote {dest} (the cluster's token, mode 0600)")
    lines += inst.install_units(plan.units, placement, None, start=not args.no_start)
    role = "the Ray head" if plan.options.is_head else f"joining {plan.options.head}"
    lines.append(
        f"node {args.node}: Ray on {plan.options.address} ({role}), "
        + ", ".join(unit.name for unit in plan.units)
    )
    for line in lines:
        print(line)
    return 0
