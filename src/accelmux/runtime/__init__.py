"""The live shell: an asyncio driver that feeds events to the same ``core.Manager`` the
simulator runs, and executes its actions against backends and monitors.

Only the clock and the executor differ from the simulator: :mod:`.clock` provides the
monotonic loop clock and a manual clock for tests, :mod:`.driver` is the clock-injectable
Manager loop, :mod:`.daemon` wires backends, monitors and tickets around it.
"""
