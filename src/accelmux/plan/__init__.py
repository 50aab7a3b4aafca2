"""``accelmux plan``: a home's own history replayed through the simulator, as recorded and
as the user asks (docs/plan.md).

- :mod:`.calibrate`: each service's measured profile from the history;
- :mod:`.export`: the history as a scenario, a request trace and a device timeline;
- :mod:`.replay`: a scenario run through the simulator, recorded like the daemon;
- :mod:`.outcomes`: the figures, computed the same way for the daemon and a replay;
- :mod:`.compare`: a replay's errors against the real run;
- :mod:`.changes`: the questions (device size, services, classes, windows, policy);
- :mod:`.engine` and :mod:`.report`: the plan and its table; :mod:`.command`: the CLI.
"""
