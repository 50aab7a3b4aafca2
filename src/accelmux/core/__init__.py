"""The pure policy core: no I/O, no clock, no OS, no asyncio.

Everything here is deterministic given its inputs: events carry the time, randomness
comes only from an injected ``random.Random``. The simulator and the live daemon drive the
same :class:`~accelmux.core.manager.Manager`.
"""
