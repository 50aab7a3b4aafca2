"""The daemon ``accelmux serve`` runs, assembled: the top of the dependency picture.

:mod:`.serve` builds the :class:`~accelmux.runtime.daemon.Runtime`, the gateway's HTTP
application and the parts that live beside it (:mod:`.wiring`: durable batch jobs,
camera analysis, the dashboard), plus the Wyoming server when ``server.wyoming`` is
set, and runs them until a signal; :mod:`.command` is ``accelmux serve`` itself. The
config's ``server:`` section configures what is assembled here.
"""
