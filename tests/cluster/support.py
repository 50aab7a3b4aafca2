"""What the cluster tests share: the environment of their processes, their configs, and
Ray (the ``cluster`` extra: ``scripts/test`` installs it).

When Ray is missing the tests that need it FAIL saying how to install it; only
``ACCELMUX_SKIP_MODELS=1`` (the switch for missing optional runtimes) turns that into a
skip. The two-machine tests live in :mod:`.lan` and :mod:`.household`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from tests.real.support import installed, missing

import accelmux

SRC = Path(accelmux.__file__).resolve().parents[1]
INSTALL_RAY = "pip install -e '.[cluster]' (scripts/test does)"


def need_ray() -> None:
    if not installed("ray"):
        missing("ray (the cluster extra)", INSTALL_RAY)


def env() -> dict[str, str]:
    """The environment of a cluster process: this checkout's accelmux first."""
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [out.get("PYTHONPATH")])])
    out["RAY_USAGE_STATS_ENABLED"] = "0"
    return out


def write_config(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path
