"""The run row: what a run of the daemon ran, without anything private.

``config``: the daemon's config as data, without its ``server`` section (API keys,
addresses, paths) and ``cluster`` section, without the services' ``backend`` sections
(commands, environments, camera URLs, model paths) and a device's ``foreign_pid_dir``.
``spec``: what the Manager actually ran with, which the config alone does not say: each
device's detected capacity and budget, each service's memory profile (a GGUF read at
start, for one), its backend's declared capabilities and, hashed, the key of the model
copy it shares with others.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from typing import Any

import psutil

from accelmux.config.schema import AccelmuxConfig
from accelmux.core.specs import ManagerSpec, ServiceSpec
from accelmux.history.records import DaemonRun


def private_free_config(cfg: AccelmuxConfig) -> dict[str, Any]:
    data = cfg.model_dump(
        mode="json", by_alias=True, include={"devices", "services", "policy", "host"}
    )
    for dev in data.get("devices", {}).values():
        dev.pop("foreign_pid_dir", None)
    for svc in data.get("services", {}).values():
        svc.pop("backend", None)
        svc.get("memory", {}).pop("gguf", None)
    return data


def _service(s: ServiceSpec) -> dict[str, Any]:
    p = s.profile
    key = s.weights_key
    return {
        "name": s.name,
        "group": s.group,
        "device": s.device,
        "init_s": s.init_s,
        "profile": {
            "weights": p.weights,
            "runtime": p.runtime,
            "kv_per_token": p.kv_bytes_per_token,
            "kv_floor": p.kv_floor,
            "kv_ceiling": p.kv_ceiling,
            "workspace": p.workspace,
            "per_unit": p.per_unit,
        },
        "capabilities": s.capabilities.as_dict(),
        "weights_key": hashlib.sha256(key.encode()).hexdigest()[:12] if key else "",
    }


def spec_data(
    spec: ManagerSpec, sample_interval_s: float = 1.0, cores: int | None = None
) -> dict[str, Any]:
    """What the Manager ran with; ``cores``: the CPU cores of a host device (what its
    compute shares are fractions of; default: this machine's)."""
    host_cores = cores or psutil.cpu_count() or os.cpu_count() or 1
    return {
        "sample_interval_s": sample_interval_s,
        "devices": [
            {
                "name": d.name,
                "kind": d.kind,
                "cores": host_cores if d.kind == "host" or cores else None,
                "capacity": d.capacity_bytes,
                "budget": d.budget_bytes,
                "headroom": d.headroom_bytes,
                "load_bandwidth": d.load_bandwidth_bps,
                "host_bandwidth": d.host_bandwidth_bps,
            }
            for d in spec.devices
        ],
        "services": [_service(s) for s in spec.services],
        "clock_origin_s_of_day": spec.clock_origin_s_of_day,
    }


def new_run(
    cfg: AccelmuxConfig,
    spec: ManagerSpec,
    version: str,
    started_wall: float | None = None,
    *,
    cores: int | None = None,
) -> DaemonRun:
    """A run for a daemon whose Manager clock reads 0 at ``started_wall``."""
    started = time.time() if started_wall is None else started_wall
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(started))
    return DaemonRun(
        run=f"{stamp}-{secrets.token_hex(3)}",
        started_wall=started,
        version=version,
        config=json.dumps(private_free_config(cfg), sort_keys=True),
        spec=json.dumps(spec_data(spec, cfg.server.sample_interval_s, cores), sort_keys=True),
    )
