"""Backends: what actually runs a service's model.

Every backend implements :class:`~accelmux.backends.base.Backend`: ``load``, ``unload``,
``resize``, ``handle`` (one request, possibly streamed), a memory report and the process
ids the monitors attribute to the service. Shipped: a supervised external server
(:mod:`.external`), a model hosted in accelmux's inference worker process
(:mod:`.worker`) and a deterministic fake for tests and demos (:mod:`.fake`).
:mod:`.factory` builds each service's backend from its config."""
