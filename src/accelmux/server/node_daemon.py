"""A cluster node's daemon: ``python -m accelmux.server.node_daemon`` (``accelmux node``
starts it and keeps it running; see :mod:`.node_agent`).

It is the machine's ordinary daemon (:func:`accelmux.server.serve.serve`) with only the
services the cluster's config lets this node host, its own ``data_dir``
(``server.data_dir/node-NAME``), listening on 127.0.0.1 and on the machine's LAN
address at ``cluster.node_port``, where every request must bring the cluster's key
(:mod:`accelmux.cluster.listener`). It never joins Ray: the node's link to Ray is a
process of its own, so the daemon serves on whatever happens to Ray.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from accelmux.cluster.hosting import config_for_node
from accelmux.cluster.listener import NodeListener
from accelmux.cluster.secret import listener_key, require_token
from accelmux.config.load import load_config
from accelmux.config.schema import AccelmuxConfig
from accelmux.errors import AccelmuxError
from accelmux.server.command import loop_factory
from accelmux.server.serve import serve


def node_data_dir(cfg: AccelmuxConfig, node: str) -> Path:
    """Where node ``node`` keeps its jobs, logs and state on its machine."""
    return Path(cfg.server.data_dir).absolute() / f"node-{node}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m accelmux.server.node_daemon")
    ap.add_argument("--node", required=True)
    ap.add_argument("-c", "--config", required=True)
    ap.add_argument("--address", required=True, help="the machine's LAN address")
    args = ap.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        cfg = load_config(args.config)
        key = listener_key(require_token())
        port = cfg.cluster.node_port
        mine = config_for_node(
            cfg,
            args.node,
            port=port,
            data_dir=node_data_dir(cfg, args.node),
            lan_address=args.address,
        )
    except AccelmuxError as exc:
        print(f"accelmux: {exc}", file=sys.stderr)
        return 2
    listener = NodeListener(args.node, args.address, port, key, cfg)
    with asyncio.Runner(loop_factory=loop_factory(mine.server.event_loop)) as runner:
        runner.run(serve(mine, listener=listener))
    return 0


if __name__ == "__main__":
    sys.exit(main())
