"""The inference worker: one process that hosts several models for the daemon.

The daemon (manager + gateway) never runs a model itself. Services with a ``worker``
backend are hosted by a worker process (:mod:`accelmux.worker.main`) that the daemon
starts and supervises; a model that crashes takes the worker down, never the manager.
(Here "host" is a verb: the device kind ``host`` and :mod:`accelmux.monitors.host` mean
the machine's RAM.)

* :mod:`~accelmux.worker.protocol`: length-prefixed frames over a Unix socket pair
  (a JSON header and one optional binary blob per frame);
* :mod:`~accelmux.worker.components`: the real models adapted to OpenAI requests, and
  their memory accounting (weights, runtime, KV, active);
* :mod:`~accelmux.worker.main`: the worker's main loop; it shares one loaded copy of a
  model file between the services that name it (refcounted);
* :mod:`~accelmux.worker.client`: the daemon's side of the connection (async, streams).

The :class:`~accelmux.backends.base.Backend` each hosted service gets lives with the
other backends (:mod:`accelmux.backends.worker`): the backends use this package, never
the other way round.
"""
