"""Cluster mode: several machines, one gateway, on Ray (docs/cluster.md).

* :mod:`.hosting`: which services of the one cluster config a node builds;
* :mod:`.snapshots`: a node's snapshot (from its daemon's ``/admin/status``) and the
  router's :class:`~accelmux.core.routing.NodeView` of it;
* :mod:`.requests`: what the gateway reads of a request to route it (its model, whether
  its answer streams);
* :mod:`.ray_link`: Ray imported only here and only when cluster mode runs, with a
  one-line error when it is missing or its cluster cannot be reached;
* :mod:`.nodes`: the gateway's table of node agents, polled for snapshots, with each
  forwarded call bounded by a timeout and by its node staying alive;
* :mod:`.gateway`: the cluster gateway's aiohttp application.

The node agent itself (a Ray actor running the machine's ordinary daemon) lives in
:mod:`accelmux.server.node_agent`, beside the daemon it runs.
"""
