"""Which accelmux runs, with which config: ``--version``, ``/admin/status`` and
``accelmux status`` name the version, the config file, its SHA-256 and the uptime, and
an old config's deprecated spellings by name."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import yaml
from tests.live.support import daemon

from accelmux import __version__

from .support import ROOT, clean_env

OLD_CONFIG = Path(__file__).parent / "data" / "config-0.1.0.yaml"


def _accelmux(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "accelmux", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(PYTHONPATH=str(ROOT / "src")),
        check=False,
    )


def test_version() -> None:
    done = _accelmux("--version")
    assert done.returncode == 0 and done.stdout == f"accelmux {__version__}\n"


def test_status_names_the_version_the_config_file_its_hash_and_the_uptime(
    tmp_path: Path,
) -> None:
    config = yaml.safe_load(OLD_CONFIG.read_text())
    with daemon(config, tmp_path, timeout=60) as d:
        text = d.config_path.read_bytes()
        digest = hashlib.sha256(text).hexdigest()
        done = _accelmux("status", "--url", d.url, "--json")
        assert done.returncode == 0, done.stderr
        server = yaml.safe_load(done.stdout)["server"]
        assert server["version"] == __version__
        assert server["uptime_s"] > 0 and server["started_at"].endswith("Z")
        assert server["config"]["file"] == str(d.config_path)
        assert server["config"]["sha256"] == digest
        (notice,) = server["config"]["deprecations"]
        assert "'inprocess' is deprecated (inprocess-backend, since accelmux 0.1.0)" in notice
        shown = _accelmux("status", "--url", d.url)
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        assert lines[0].startswith(f"accelmux {__version__}  policy accelmux  up ")
        assert lines[1] == f"config {d.config_path}  sha256 {digest}"
        assert lines[2].startswith("  deprecated: services.chat.backend.type: 'inprocess'")


def test_check_names_each_deprecation_of_an_old_config() -> None:
    done = _accelmux("check", str(OLD_CONFIG))
    assert done.returncode == 0, done.stderr
    assert (
        f"{OLD_CONFIG}: services.chat.backend.type: 'inprocess' is deprecated "
        "(inprocess-backend, since accelmux 0.1.0), write 'worker'"
    ) in done.stderr
