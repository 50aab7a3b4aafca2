"""Readiness, status and watchdog notifications to systemd (``sd_notify``).

Under a ``Type=notify`` unit systemd passes ``NOTIFY_SOCKET`` (a Unix datagram socket,
``@`` for the abstract namespace) and, with ``WatchdogSec=``, ``WATCHDOG_USEC`` and
``WATCHDOG_PID``. The daemon sends ``READY=1`` once it listens, ``WATCHDOG=1`` at half
the watchdog interval while its event loop and its Manager keep turning, ``STATUS=``
lines, and ``STOPPING=1`` when it begins to stop. Outside systemd (no ``NOTIFY_SOCKET``)
nothing is sent.

The protocol is one datagram of ``KEY=VALUE`` lines; it is written here (a dozen lines)
rather than taken from ``python-systemd``, which builds against libsystemd's headers and
so cannot install from a wheel everywhere accelmux does. The variables are removed from
the environment once read, so a child process (the inference worker, an external server)
never notifies in the daemon's name.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable, MutableMapping

NOTIFY_VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


class Notifier:
    """Sends notifications to one socket; every failure to send is swallowed (systemd
    gone, socket full): notifying must never stop the daemon."""

    def __init__(self, address: str, watchdog_usec: int | None = None) -> None:
        self.address = "\0" + address[1:] if address.startswith("@") else address
        self.watchdog_usec = watchdog_usec

    @classmethod
    def from_environment(cls, environ: MutableMapping[str, str] | None = None) -> Notifier | None:
        """The notifier systemd asked for, or None; the variables are removed from
        ``environ`` (default ``os.environ``) either way."""
        env = os.environ if environ is None else environ
        address = env.pop("NOTIFY_SOCKET", "")
        usec = env.pop("WATCHDOG_USEC", "")
        pid = env.pop("WATCHDOG_PID", "")
        if not address:
            return None
        watchdog = int(usec) if usec.isdigit() and int(usec) > 0 else None
        if pid and pid != str(os.getpid()):
            watchdog = None  # the watchdog is another process's
        return cls(address, watchdog)

    @property
    def watchdog_interval_s(self) -> float | None:
        """How often to ping: half the watchdog timeout (None: no watchdog)."""
        return None if self.watchdog_usec is None else self.watchdog_usec / 2e6

    def send(self, *fields: str) -> bool:
        message = "\n".join(fields).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.connect(self.address)
                s.sendall(message)
        except OSError:
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.send("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def status(self, status: str) -> bool:
        return self.send(f"STATUS={status}")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def stopping(self, status: str = "stopping") -> bool:
        return self.send("STOPPING=1", f"STATUS={status}")


async def keep_alive(notifier: Notifier, problem: Callable[[], str | None]) -> None:
    """Ping the watchdog every half interval while ``problem()`` finds none; while it
    finds one, say it in ``STATUS=`` and let the watchdog run out (systemd restarts the
    daemon). Returns at once when the unit has no watchdog."""
    interval = notifier.watchdog_interval_s
    if interval is None:
        return
    while True:
        why = problem()
        if why is None:
            notifier.watchdog()
        else:
            notifier.status(f"unhealthy: {why}")
        await asyncio.sleep(interval)
