"""``accelmux serve``: run the daemon (gateway + Manager + backends + monitors).

Without ``-c`` it stops with a message: the embedded real stack will become the default
later; today a config is required (``examples/fake-stack.yaml`` runs anywhere).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from typing import Any

NO_CONFIG = (
    "accelmux serve: a config file is required for now (-c FILE).\n"
    "  Try the fake stack, which needs no model: accelmux serve -c examples/fake-stack.yaml\n"
    "  (in a source checkout; every example in examples/ is documented)."
)


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the daemon: gateway, policy, backends, monitors")
    p.add_argument("-c", "--config", help="YAML config file")
    p.add_argument("--host", help="listen address (default: server.host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="listen port (default: server.port, 8600)")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (default INFO)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import logging

    from accelmux.config.load import load_config

    if not args.config:
        print(NO_CONFIG, file=sys.stderr)
        return 2
    cfg = load_config(args.config)
    update: dict[str, Any] = {}
    if args.host:
        update["host"] = args.host
    if args.port is not None:
        if not 0 < args.port < 65536:
            print(f"accelmux serve: --port must be 1..65535 (got {args.port})", file=sys.stderr)
            return 2
        update["port"] = args.port
    if update:
        cfg = cfg.model_copy(update={"server": cfg.server.model_copy(update=update)})
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from accelmux.runtime.serve import serve

    with asyncio.Runner(loop_factory=loop_factory(cfg.server.event_loop)) as runner:
        runner.run(serve(cfg))
    return 0


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when asked for, or when installed and ``auto``; None: asyncio's default."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise SystemExit(
                "accelmux: server.event_loop is uvloop but uvloop is not installed"
            ) from None
        return None
    return uvloop.new_event_loop
