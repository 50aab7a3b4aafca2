"""``accelmux check FILE`` refuses what ``serve`` would refuse on this machine: a
``data_dir`` it cannot create or write (even as root, under ``/proc``), an ``nvidia``
device NVML does not have (when serve would read its capacity there), a non-loopback
host without API keys. A config it passes
leaves nothing behind (the data directory is tried, then removed again)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from tests.live.support import base_config, free_port

#: A GPU index no test machine has.
ABSENT_GPU = 7


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "accelmux.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _write(tmp: Path, name: str, cfg: dict[str, Any]) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_check_refuses_what_serve_would_refuse(tmp_path: Path) -> None:
    cases: dict[str, tuple[dict[str, Any], list[str]]] = {}
    under_proc = base_config()
    under_proc["server"]["data_dir"] = "/proc/accelmux-check-test/data"
    cases["data_dir under /proc"] = (under_proc, ["server.data_dir", "/proc/accelmux-check-test"])

    gpu = base_config()
    gpu["devices"]["gpu"] = {"kind": "nvidia", "index": ABSENT_GPU}
    gpu["server"]["data_dir"] = str(tmp_path / "gpu-data")
    cases["absent nvidia GPU"] = (gpu, ["devices.gpu.index", f"NVIDIA GPU {ABSENT_GPU}"])

    open_host = base_config()
    open_host["server"].update(host="0.0.0.0", data_dir=str(tmp_path / "open-data"))
    cases["non-loopback host without API keys"] = (open_host, ["server.host", "api_keys"])

    for i, (name, (cfg, wants)) in enumerate(cases.items()):
        path = _write(tmp_path, f"case{i}", cfg)
        out = _cli("check", str(path))
        assert out.returncode == 2, (name, out.stdout, out.stderr)
        assert "Traceback" not in out.stderr, out.stderr
        for want in wants:
            assert want in out.stderr, (name, want, out.stderr)
        if "GPU" in name or "/proc" in name:  # serve refuses these too
            served = _cli("serve", "-c", str(path), "--port", str(free_port()))
            assert served.returncode != 0 and "listening" not in served.stdout, served
    assert not (tmp_path / "open-data").exists()  # check tried it, and removed it again


def test_check_of_a_good_config_leaves_nothing_behind(tmp_path: Path) -> None:
    cfg = base_config()
    data = tmp_path / "new" / "nested" / "data"
    cfg["server"]["data_dir"] = str(data)
    out = _cli("check", str(_write(tmp_path, "ok", cfg)))
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "new").exists()
    # an existing data_dir is tried in place and left as it was
    data.mkdir(parents=True)
    out = _cli("check", str(_write(tmp_path, "ok", cfg)))
    assert out.returncode == 0, out.stderr
    assert list(data.iterdir()) == []
