"""The two links to Ray, each run as a process of its own (kept by :mod:`.child`).

``python -m accelmux.cluster.registry node ...`` (one per node, kept by ``accelmux
node``) joins the cluster through this machine's Ray node and registers the node: a
small named actor, ``accelmux-node-NAME`` in the ``accelmux`` namespace, pinned to this
machine's Ray node (not soft: it never moves), holding what the gateways need to reach
the node's daemon directly: its LAN address and port. It takes the node's declared
``accelmux_device_mib``, so other Ray work placed by that resource goes elsewhere. The
actor belongs to this process: when the process, its Ray node or the machine ends, Ray
ends the entry, and a second ``accelmux node`` for the same name finds it taken.

``python -m accelmux.cluster.registry watch ...`` (one per gateway, kept by ``accelmux
serve --cluster``) lists the entries every interval and reports every change.

Both report on standard output, one JSON object a line (``{"event": ...}``); everything
Ray writes goes to standard error, which the keeper appends to a log file. Ray ends a
process whose cluster has been gone for a minute; the keeper starts it again, and it
joins again once the head is back.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any

from accelmux.cluster.ray_link import (
    DEVICE_RESOURCE,
    NAMESPACE,
    agent_name,
    agent_names,
    connect,
)
from accelmux.errors import ClusterError

#: How often a node's link checks that its entry is still there.
CHECK_S = 2.0
#: A link that died leaves its entry behind until Ray notices its owner is gone.
NAME_TAKEN_WAIT_S = 20.0
#: Exit status of a problem a retry cannot fix (a refused token): the keeper says so.
FATAL = 3


def report(data: dict[str, Any], out: Any = None) -> None:
    """Write one report line (read by the keeper, :mod:`accelmux.server.kept`)."""
    stream = out if out is not None else sys.stdout
    stream.write(json.dumps(data) + "\n")
    stream.flush()


def reports_to_stdout_only() -> Any:
    """Keep the real standard output for reports and send everything else written to
    file descriptors 1 and 2 (Ray's C++ core and its Python logging write there) to
    standard error, which the keeper appends to the child's log file; the stream
    reports go to."""
    private = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    return os.fdopen(private, "w", buffering=1)


class NodeEntry:
    """The registered node: where its daemon listens (the body of a Ray actor)."""

    def __init__(self, entry: dict[str, Any]) -> None:
        self.entry = entry

    def endpoint(self) -> dict[str, Any]:
        return self.entry


def _own_node(ray: Any) -> tuple[str, float]:
    """This process's Ray node id and the ``accelmux_device_mib`` it declares."""
    node_id = str(ray.get_runtime_context().get_node_id())
    for info in ray.nodes():
        if info.get("NodeID") == node_id:
            return node_id, float(info.get("Resources", {}).get(DEVICE_RESOURCE, 0))
    return node_id, 0.0


def register(ray: Any, node: str, address: str, port: int) -> Any:
    """Create node ``node``'s entry on this machine's Ray node; its actor handle."""
    from ray.util.scheduling_strategies import (  # noqa: PLC0415  # optional extra (Ray)
        NodeAffinitySchedulingStrategy,
    )

    node_id, declared = _own_node(ray)
    entry = {
        "node": node,
        "address": address,
        "port": port,
        "ray_node_id": node_id,
        "registered_at": time.time(),
    }
    name = agent_name(node)
    deadline = time.monotonic() + NAME_TAKEN_WAIT_S
    while True:
        try:
            ray.get_actor(name)
        except ValueError:  # no such actor: the usual case
            break
        if time.monotonic() > deadline:
            raise ClusterError(
                f"node {node!r} is already registered by another machine or process "
                "(one accelmux node per node name)"
            )
        time.sleep(0.5)
    resources = {DEVICE_RESOURCE: declared} if declared > 0 else {}
    actor = (
        ray.remote(NodeEntry)
        .options(
            name=name,
            namespace=NAMESPACE,
            num_cpus=0,
            resources=resources,
            max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
        )
        .remote(entry)
    )
    ray.get(actor.endpoint.remote(), timeout=60)
    return actor, entry


def run_node(args: argparse.Namespace, out: Any) -> int:
    ray = connect(args.cluster)
    actor, entry = register(ray, args.node, args.address, args.port)
    report({"event": "registered", **entry}, out)
    while True:
        time.sleep(CHECK_S)
        ray.get(actor.endpoint.remote(), timeout=10)


def _entries(ray: Any, known: dict[str, tuple[str, dict[str, Any]]]) -> None:
    """Bring ``known`` (node -> (actor id, entry)) up to date with the registered nodes."""
    names = agent_names(ray)
    for gone in set(known) - set(names):
        del known[gone]
    for node in names:
        try:
            handle = ray.get_actor(agent_name(node))
            actor_id = handle._actor_id.hex()
            if node in known and known[node][0] == actor_id:
                continue
            known[node] = (actor_id, dict(ray.get(handle.endpoint.remote(), timeout=5)))
        except Exception:  # an entry that ended meanwhile: gone at the next round
            known.pop(node, None)


def run_watch(args: argparse.Namespace, out: Any) -> int:
    ray = connect(args.cluster)
    report({"event": "joined"}, out)
    known: dict[str, tuple[str, dict[str, Any]]] = {}
    last: dict[str, dict[str, Any]] | None = None
    while True:
        _entries(ray, known)
        nodes = {node: entry for node, (_, entry) in sorted(known.items())}
        if nodes != last:
            report({"event": "nodes", "nodes": nodes}, out)
            last = nodes
        time.sleep(args.interval)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m accelmux.cluster.registry")
    sub = ap.add_subparsers(dest="what", required=True)
    node = sub.add_parser("node")
    node.add_argument("--cluster", required=True)
    node.add_argument("--node", required=True)
    node.add_argument("--address", required=True)
    node.add_argument("--port", type=int, required=True)
    watch = sub.add_parser("watch")
    watch.add_argument("--cluster", required=True)
    watch.add_argument("--interval", type=float, default=0.5)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    out = reports_to_stdout_only()
    try:
        return run_node(args, out) if args.what == "node" else run_watch(args, out)
    except ClusterError as exc:
        fatal = "refused this machine's token" in str(exc) or "already registered" in str(exc)
        report({"event": "error", "message": str(exc), "fatal": fatal}, out)
        return FATAL if fatal else 1
    except KeyboardInterrupt:
        return 0
    except Exception as exc:  # Ray lost its cluster, or an entry call failed
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        print(f"registry link: {type(exc).__name__}: {first}", file=sys.stderr)
        report({"event": "error", "message": "the Ray cluster stopped answering"}, out)
        return 1


if __name__ == "__main__":
    sys.exit(main())
