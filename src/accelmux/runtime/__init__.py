"""The live shell: an asyncio driver that feeds events to the same ``core.Manager`` the
simulator runs, and executes its actions against backends and monitors.

Only the clock and the executor differ from the simulator: :mod:`.clock` provides the
monotonic loop clock and a manual clock for tests, :mod:`.driver` is the clock-injectable
Manager loop, and :mod:`.daemon`'s ``Runtime`` builds the rest around it, one job per
module: the request runner (:mod:`.request_runner`, :mod:`.requests`), the action
executor (:mod:`.executor`), what is kept of the decisions (:mod:`.decisions`), the
memory sampler (:mod:`.sampler`), ``/admin/status`` (:mod:`.status`) and device
detection (:mod:`.devices`).
"""
