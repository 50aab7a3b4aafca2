"""``accelmux node``: start (or stop) this machine's node agent in a Ray cluster.

It validates the config here (every problem listed, as ``accelmux check`` does), joins
the cluster, starts the detached agent pinned to this machine's Ray node, waits until
its daemon answers, prints what it serves, and returns: the agent keeps running inside
Ray until ``accelmux node --stop`` or the machine's Ray node ends (docs/cluster.md).
Ray and the daemon are imported when the command runs, not when the CLI registers it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "node", help="cluster mode: start this machine's node agent in a Ray cluster"
    )
    p.add_argument("--node", required=True, help="this node's name (services.NAME.nodes)")
    p.add_argument("-c", "--config", help="the cluster's YAML config (required to start)")
    p.add_argument(
        "--cluster",
        metavar="ADDRESS",
        help="the Ray cluster's head, host:port (default: cluster.address of the config)",
    )
    p.add_argument(
        "--ray-node-id",
        metavar="ID",
        help="pin the agent to this Ray node instead of this machine's (several Ray nodes "
        "on one machine, as in tests)",
    )
    p.add_argument("--stop", action="store_true", help="stop the node's agent instead")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from accelmux.cluster.hosting import check_node_name  # noqa: PLC0415  # --help stays fast
    from accelmux.cluster.ray_link import connect  # noqa: PLC0415  # --help stays fast
    from accelmux.config.load import load_config  # noqa: PLC0415  # --help stays fast
    from accelmux.server import node_agent  # noqa: PLC0415  # --help stays fast

    cfg = load_config(args.config) if args.config else None
    if cfg is not None:
        check_node_name(cfg, args.node)  # a typo is told before joining any cluster
    address = args.cluster or (cfg.cluster.address if cfg is not None else None)
    if not address:
        print("accelmux node: give --cluster ADDRESS (or cluster.address)", file=sys.stderr)
        return 2
    if args.stop:
        ray = connect(address)
        stopped = node_agent.stop_agent(ray, args.node)
        print(f"node {args.node}: {'stopped' if stopped else 'had no agent'}")
        return 0
    if cfg is None:
        print("accelmux node: give the cluster's config with -c FILE", file=sys.stderr)
        return 2
    ray = connect(address)
    snap = node_agent.start_agent(
        ray, node=args.node, config_path=Path(args.config), ray_node_id=args.ray_node_id
    )
    services = ", ".join(s["service"] for s in snap["services"]) or "none"
    print(
        f"node {args.node}: agent started (daemon on 127.0.0.1:{snap['port']}; "
        f"services: {services})",
        flush=True,
    )
    return 0
