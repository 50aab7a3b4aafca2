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
    snapshot_interval_s: float = Field(
        0.5, gt=0, le=60, description="How often the gateway asks every node for its snapshot."
    )
    snapshot_timeout_s: float = Field(
        2.0,
        gt=0,
        le=600,
        description="A node whose snapshot takes longer is marked down: its requests in "
        "flight fail with 502 and its services are routed elsewhere.",
    )
    request_timeout_s: float = Field(
        600.0, gt=0, le=86_400, description="Longest a forwarded request may take (then 504)."
    )
    retry_after_s: float = Field(
        5.0, gt=0, le=3600, description="Retry-After of the 503 for a service no live node hosts."
    )
