"""The discrete-event simulator: the same core Manager on a virtual clock.

Modules: ``engine`` (event heap and clock), ``physical`` (true memory and OOMs),
``compute`` (service times and contention), ``workloads`` and ``trace`` (arrivals),
``executor`` (actions to simulated effects), ``metrics`` and ``report``, ``runner``
(policies x seeds x device sizes), ``scenario`` (the YAML schema), ``parity`` (decision
logs for the live runtime's parity test), ``command`` (``accelmux simulate``).
"""
