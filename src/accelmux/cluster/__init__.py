"""Cluster mode: several machines, one gateway, found through Ray (docs/cluster.md).

* :mod:`.hosting`: which services of the one cluster config a node builds;
* :mod:`.snapshots`: a node's snapshot (from its Manager) and the router's
  :class:`~accelmux.core.routing.NodeView` of it;
* :mod:`.listener`: a node daemon's LAN listener (the cluster's key) and its snapshot;
* :mod:`.secret`: the cluster's key, derived from Ray's authentication token;
* :mod:`.requests`: what the gateway reads of a request to route it (its model, whether
  its answer streams);
* :mod:`.ray_link`: Ray imported only here, and only by the link processes;
* :mod:`.registry`: the links to Ray: a node's registration, a gateway's watch;
* :mod:`.nodes`: the gateway's table of nodes, polled and called directly over HTTP;
* :mod:`.explain`: why the gateway sent a request where it did;
* :mod:`.gateway`: the cluster gateway's aiohttp application.

The node agent (``accelmux node``), its daemon and the gateway's main coroutine live in
:mod:`accelmux.server`, beside the daemon they run.
"""
