"""The ``cluster:`` section: accelmux on several machines joined by a Ray cluster.

One config file serves every machine: each service may list the nodes it may run on
(``services.NAME.nodes``, default every node); the node agent started with
``accelmux node --node NAME`` builds only the services of its node, and the cluster
gateway (``accelmux serve --cluster ADDRESS``) routes each request to a node that hosts
its service. See docs/cluster.md.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

NODE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class ClusterConfig(BaseModel):
    """Where the Ray cluster is and how the cluster gateway watches its nodes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    address: str | None = Field(
        None,
        description="The Ray cluster to join (host:port of its head, or auto); "
        "--cluster overrides it. None: a single machine, no Ray.",
    )
    nodes: list[Annotated[str, Field(pattern=NODE_NAME_PATTERN)]] = Field(
        default_factory=list,
        description="Node names; when set, `accelmux node --node` and every "
        "services.NAME.nodes entry must be one of them (a typo is an error, not a node "
        "that serves nothing).",
    )
    node_port: int = Field(
        8601,
        ge=1,
        le=65535,
        description="The port of each node's daemon: on 127.0.0.1 for that machine's own "
        "tools, and on its LAN address for the gateways (which must bring the cluster's "
        "key, derived from Ray's token).",
    )
    snapshot_interval_s: float = Field(
        0.5, gt=0, le=60, description="How often the gateway asks every node for its snapshot."
    )
    snapshot_timeout_s: float = Field(
        1.0,
        gt=0,
        le=600,
        description="A node whose snapshot takes longer is marked down: its requests in "
        "flight fail (those that never reached it are tried on another node) and its "
        "services are routed elsewhere. With the interval, a lost node is down within "
        "their sum.",
    )
    request_timeout_s: float = Field(
        600.0, gt=0, le=86_400, description="Longest a forwarded request may take (then 504)."
    )
    retry_after_s: float = Field(
        5.0, gt=0, le=3600, description="Retry-After of the 503 for a service no live node hosts."
    )
