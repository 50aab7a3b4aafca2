"""``accelmux node``: run this machine's node agent of a cluster (docs/cluster.md).

It validates the config here (every problem listed, as ``accelmux check`` does), checks
that Ray is installed and that this machine has the cluster's token, then runs the node
agent in the foreground (:mod:`.node_agent`): the node's daemon, and its registration in
the Ray cluster, each started again when it ends. ``--stop`` ends the agent running for
that node on this machine. Ray and the daemon are imported when the command runs, not
when the CLI registers it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "node", help="cluster mode: run this machine's node agent (its daemon, registered in Ray)"
    )
    p.add_argument("--node", required=True, help="this node's name (services.NAME.nodes)")
    p.add_argument("-c", "--config", help="the cluster's YAML config (required to start)")
    p.add_argument(
        "--cluster",
        metavar="ADDRESS",
        help="the Ray cluster's head, host:port (default: cluster.address of the config)",
    )
    p.add_argument(
        "--address",
        help="this machine's LAN address for the gateways (default: the address this "
        "machine reaches the head from, which its Ray node uses too)",
    )
    p.add_argument("--stop", action="store_true", help="stop the node's agent on this machine")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from accelmux.cluster.hosting import check_node_name  # noqa: PLC0415  # --help stays fast
    from accelmux.cluster.ray_link import local_address, need_ray  # noqa: PLC0415  # --help stays fast
    from accelmux.cluster.secret import require_token  # noqa: PLC0415  # --help stays fast
    from accelmux.config.load import load_config  # noqa: PLC0415  # --help stays fast
    from accelmux.server import node_agent  # noqa: PLC0415  # --help stays fast
    from accelmux.server.node_daemon import node_data_dir  # noqa: PLC0415  # --help stays fast

    if not args.config:
        print("accelmux node: give the cluster's config with -c FILE", file=sys.stderr)
        return 2
    cfg = load_config(args.config)
    check_node_name(cfg, args.node)  # a typo is told before anything starts
    data_dir = node_data_dir(cfg, args.node)
    if args.stop:
        stopped = node_agent.stop_agent(data_dir, cfg.server.drain_s + 30, time.sleep)
        print(f"node {args.node}: {'stopped' if stopped else 'no agent runs here'}")
        return 0
    address = args.cluster or cfg.cluster.address
    if not address:
        print("accelmux node: give --cluster ADDRESS (or cluster.address)", file=sys.stderr)
        return 2
    need_ray()
    require_token()
    plan = node_agent.AgentPlan(
        node=args.node,
        config=Path(args.config).absolute(),
        cluster=address,
        address=args.address or local_address(address),
        port=cfg.cluster.node_port,
        data_dir=data_dir,
    )
    return node_agent.run_agent(plan)
