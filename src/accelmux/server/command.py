"""``accelmux serve``: run the daemon (gateway + Manager + backends + monitors).

Without ``-c`` it runs the default stack (:mod:`accelmux.defaults.stack`): real models
for every modality in one shared inference worker, on this machine's RAM, with a budget
and headroom chosen from the RAM and printed at start. ``--show-config`` prints that
config as YAML instead (a starting point for your own file).

The config loader, the daemon and the default stack are imported when the command runs
(``# noqa: PLC0415``), not when the CLI registers it, so ``accelmux --help`` stays fast.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import yaml

from accelmux.errors import BackendError

NO_MODELS = (
    "accelmux serve: the default stack needs the real models: {error}\n"
    "  Install them with `accelmux setup` (scripts/setup-models.sh in a checkout), or run a\n"
    "  config that needs none: accelmux serve -c examples/fake-stack.yaml"
)


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the daemon: gateway, policy, backends, monitors")
    p.add_argument("-c", "--config", help="YAML config file")
    p.add_argument("--host", help="listen address (default: server.host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="listen port (default: server.port, 8600)")
    p.add_argument(
        "--allow-open",
        action="store_true",
        help="serve /v1 without API keys on a non-loopback --host (server.allow_unauthenticated)",
    )
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (default INFO)")
    p.add_argument(
        "--cluster",
        metavar="ADDRESS",
        help="run the cluster gateway: join the Ray cluster at ADDRESS (its head's host:port) "
        "and route each request to a node agent (docs/cluster.md; default: cluster.address)",
    )
    p.add_argument(
        "--show-config",
        action="store_true",
        help="print the config that would run (the default stack without -c) and exit",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from accelmux.config.load import load_config  # noqa: PLC0415  # --help stays fast
    from accelmux.sim.baselines import register_baselines  # noqa: PLC0415  # --help stays fast

    register_baselines()  # policy.name may name one, run for comparison
    cfg = load_config(args.config) if args.config else None
    address = args.cluster or (cfg.cluster.address if cfg is not None else None)
    if address and not args.show_config:
        return run_cluster(args, address, cfg)
    if cfg is not None:
        if args.show_config:
            print(Path(args.config).read_text(encoding="utf-8"), end="")
            return 0
    else:
        loaded, code = default_stack(show=args.show_config)
        if loaded is None:
            return code
        cfg = loaded
    server = server_overrides(args, cfg.server)
    if server is None:
        return 2
    cfg = cfg.model_copy(update={"server": server})
    setup_logging(args)
    from accelmux.server.serve import serve  # noqa: PLC0415  # --help stays fast

    with asyncio.Runner(loop_factory=loop_factory(cfg.server.event_loop)) as runner:
        runner.run(serve(cfg))
    return 0


def setup_logging(args: argparse.Namespace) -> None:
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def server_overrides(args: argparse.Namespace, server: Any) -> Any:
    """``server`` with --host, --port and --allow-open applied; None (after saying why)
    for a port out of range."""
    update: dict[str, Any] = {}
    if args.host:
        update["host"] = args.host
    if args.allow_open:
        update["allow_unauthenticated"] = True
    if args.port is not None:
        if not 0 < args.port < 65536:
            print(f"accelmux serve: --port must be 1..65535 (got {args.port})", file=sys.stderr)
            return None
        update["port"] = args.port
    return server.model_copy(update=update) if update else server


def run_cluster(args: argparse.Namespace, address: str, cfg: Any) -> int:
    """``serve --cluster``: the gateway in front of the cluster's nodes."""
    from accelmux.cluster.hosting import configured_hosts, deadlines  # noqa: PLC0415  # --help stays fast
    from accelmux.cluster.ray_link import need_ray  # noqa: PLC0415  # --help stays fast
    from accelmux.config.cluster import ClusterConfig  # noqa: PLC0415  # --help stays fast
    from accelmux.config.server import ServerConfig  # noqa: PLC0415  # --help stays fast
    from accelmux.server.cluster_serve import serve_cluster  # noqa: PLC0415  # --help stays fast

    server = server_overrides(args, cfg.server if cfg is not None else ServerConfig())
    if server is None:
        return 2
    cluster = cfg.cluster if cfg is not None else ClusterConfig()
    need_ray()
    setup_logging(args)
    with asyncio.Runner(loop_factory=loop_factory(server.event_loop)) as runner:
        runner.run(
            serve_cluster(
                server,
                cluster,
                address=address,
                configured=configured_hosts(cfg) if cfg is not None else None,
                deadlines=deadlines(cfg) if cfg is not None else None,
            )
        )
    return 0


def default_stack(*, show: bool) -> tuple[Any, int]:
    """(the default stack's config, 0) after printing its summary line, or (None, exit
    code) after printing its YAML (``show``: 0) or why it cannot run (2)."""
    from accelmux.config.load import load_config_data  # noqa: PLC0415  # --help stays fast
    from accelmux.defaults import stack  # noqa: PLC0415  # --help stays fast

    total = int(psutil.virtual_memory().total)
    try:
        data = stack.default_config_data(total_ram=total)
    except BackendError as exc:
        print(NO_MODELS.format(error=exc), file=sys.stderr)
        return None, 2
    if show:
        plain = json.loads(json.dumps(data))  # no shared objects: no YAML anchors
        print(yaml.safe_dump(plain, sort_keys=False), end="")
        return None, 0
    print(stack.summary(data, total), flush=True)
    cfg = load_config_data(data, "default stack")
    canonical = json.dumps(data, sort_keys=True, default=str).encode("utf-8")
    cfg.note_source("default stack", hashlib.sha256(canonical).hexdigest())
    return cfg, 0


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when asked for, or when installed and ``auto``; None: asyncio's default."""
    if choice == "asyncio":
        return None
    try:
        import uvloop  # noqa: PLC0415  # optional: used only when installed
    except ImportError:
        if choice == "uvloop":
            raise SystemExit(
                "accelmux: server.event_loop is uvloop but uvloop is not installed"
            ) from None
        return None
    return uvloop.new_event_loop
