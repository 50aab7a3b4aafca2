"""The unit ``accelmux service install`` writes, in docs/install.md, rendered from the code.

Not from benchmark JSON: :func:`accelmux.service.daemon_unit.daemon_unit` itself, for one
example machine (an NVIDIA GPU and an AMD or Intel render node, the ``video`` and
``render`` groups present, accelmux in ``/opt/accelmux``, a config in /etc/accelmux
whose ``data_dir`` is ``/srv/accelmux``), so the page shows exactly what is installed.
"""

from __future__ import annotations

from collections.abc import Callable

from accelmux.service.daemon_unit import DaemonOptions, Machine, daemon_unit, sysusers_entry
from accelmux.service.unit import render_environment_dropin, render_unit

EXAMPLE = DaemonOptions(
    python="/opt/accelmux/bin/python",
    config="/etc/accelmux/config.yaml",
    data_dir="/srv/accelmux",
    drain_s=10.0,
)
MACHINE = Machine(device_families=("nvidia", "dri"), groups=("video", "render"), home="/root")


def service_unit() -> str:
    unit = daemon_unit(EXAMPLE, MACHINE)
    return "\n".join(
        [
            "`/etc/systemd/system/accelmux.service`:",
            "",
            "```ini",
            render_unit(unit).rstrip("\n"),
            "```",
            "",
            "`/etc/systemd/system/accelmux.service.d/environment.conf` (written once, then yours):",
            "",
            "```ini",
            render_environment_dropin(unit.name, []).rstrip("\n"),
            "```",
            "",
            "`/etc/sysusers.d/accelmux.conf`:",
            "",
            "```",
            sysusers_entry().rstrip("\n"),
            "```",
        ]
    )


BLOCKS: dict[str, Callable[[], str]] = {"service-unit": service_unit}
