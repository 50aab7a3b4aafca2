"""``accelmux service install``: the unit systemd reads is valid, hardened, and what the
daemon needs; the files land where they should and an edited drop-in survives."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from accelmux.service.daemon_unit import (
    CACHE_DIR,
    STATE_DIR,
    DaemonOptions,
    Machine,
    daemon_unit,
    resolved_data_dir,
)
from accelmux.service.install import Placement, closed_to_others, install_units
from accelmux.service.unit import (
    DEVICE_GROUPS,
    Sandbox,
    ServiceUnit,
    render_environment_dropin,
    render_unit,
    unit_problems,
)

from .support import ROOT, command_line, exposure, service_cli, verify

GPU_BOX = Machine(device_families=tuple(DEVICE_GROUPS), groups=("video", "render"), home="/root")
CPU_BOX = Machine(device_families=(), groups=(), home="/home/ada")
PYTHON = sys.executable


def _lines(text: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(f"{key}=")]


def _write(tmp_path: Path, unit: ServiceUnit) -> Path:
    path = tmp_path / unit.file_name
    path.write_text(render_unit(unit), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("options", "machine"),
    [
        (DaemonOptions(python=PYTHON), GPU_BOX),
        (DaemonOptions(python=PYTHON), CPU_BOX),
        (DaemonOptions(python=PYTHON, config="/etc/accelmux/x.yaml", data_dir="/srv/a"), GPU_BOX),
        (DaemonOptions(python=PYTHON, config="/etc/accelmux/x.yaml", data_dir="./d"), CPU_BOX),
    ],
)
def test_the_system_unit_passes_systemd_analyze_verify(
    tmp_path: Path, options: DaemonOptions, machine: Machine
) -> None:
    path = _write(tmp_path, daemon_unit(options, machine))
    dropin = tmp_path / f"{path.name}.d" / "environment.conf"
    dropin.parent.mkdir()
    dropin.write_text(render_environment_dropin("accelmux", [("ACCELMUX_X", "a b%c$d")]))
    done = verify(path)
    assert done.returncode == 0 and done.stdout + done.stderr == "", done.stdout + done.stderr


def test_the_user_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    unit = daemon_unit(DaemonOptions(python=PYTHON, user_mode=True), CPU_BOX)
    done = verify(_write(tmp_path, unit), user=True)
    assert done.returncode == 0 and done.stdout + done.stderr == "", done.stdout + done.stderr
    text = render_unit(unit)
    assert "User=" not in text and "WantedBy=default.target" in text
    assert "Type=notify" in text and "NoNewPrivileges=yes" in text


def test_the_system_unit_is_hardened_and_runs_the_daemon_as_a_notify_service() -> None:
    options = DaemonOptions(python=PYTHON, config="/etc/accelmux/a.yaml", data_dir="/srv/a")
    text = render_unit(daemon_unit(options, GPU_BOX))
    assert _lines(text, "ExecStart") == [f"{PYTHON} -m accelmux serve -c /etc/accelmux/a.yaml"]
    for setting in (
        "Type=notify",
        "NotifyAccess=main",
        "WatchdogSec=30",
        "Restart=on-failure",
        "StandardOutput=journal",
        "StandardError=journal",
        "User=accelmux",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "DevicePolicy=closed",
        "CapabilityBoundingSet=",
        "KillMode=mixed",
        "StateDirectory=accelmux",
        "UMask=0077",
    ):
        assert setting in text.splitlines(), setting
    # the data directory outside the state directory is the one writable path added
    assert _lines(text, "ReadWritePaths") == ["/srv/a"]
    # only the GPU device groups: NVIDIA, DRM render nodes, AMD's kfd, NPUs
    devices = _lines(text, "DeviceAllow")
    assert devices == [f"{g} rw" for family in DEVICE_GROUPS.values() for g in family]
    assert _lines(text, "SupplementaryGroups") == ["video render"]
    # stop: the drain, then unloading every backend
    assert _lines(text, "TimeoutStopSec") == [str(10 + 30)]


def test_a_machine_without_accelerators_gets_no_device_node(tmp_path: Path) -> None:
    text = render_unit(daemon_unit(DaemonOptions(python=PYTHON), CPU_BOX))
    assert "DevicePolicy=closed" in text.splitlines()
    assert _lines(text, "DeviceAllow") == [] and _lines(text, "SupplementaryGroups") == []
    env = _lines(text, "Environment")
    assert env == [f"ACCELMUX_DATA_DIR={STATE_DIR}", f"ACCELMUX_MODEL_CACHE={CACHE_DIR}/models"]


def test_systemd_rates_the_unit_exposure_ok(tmp_path: Path) -> None:
    """``systemd-analyze security``: 0 is fully sandboxed, 10 not at all; OK is below 3.5
    (a unit with only ``User=`` and ``Restart=`` rates about 9, UNSAFE)."""
    score, label = exposure(_write(tmp_path, daemon_unit(DaemonOptions(python=PYTHON), GPU_BOX)))
    assert label == "OK" and score < 3.5, (score, label)
    bare = ServiceUnit(name="bare", description="bare", exec_start=(PYTHON,), user="nobody")
    bare_score, _ = exposure(_write(tmp_path, bare))
    assert bare_score > score + 4


@pytest.mark.parametrize(
    ("data_dir", "expected"),
    [
        (None, STATE_DIR),
        ("./accelmux-data", f"{STATE_DIR}/accelmux-data"),
        ("data/../jobs", f"{STATE_DIR}/jobs"),
        ("/srv/accelmux", "/srv/accelmux"),
        ("~/d", f"{STATE_DIR}/d"),
    ],
)
def test_a_relative_data_dir_is_read_from_the_state_directory(
    data_dir: str | None, expected: str
) -> None:
    options = DaemonOptions(python=PYTHON, config="/etc/a.yaml", data_dir=data_dir)
    assert resolved_data_dir(options, STATE_DIR) == expected
    text = render_unit(daemon_unit(options, CPU_BOX))
    writable = [] if expected.startswith(STATE_DIR) else [expected]
    assert _lines(text, "ReadWritePaths") == writable


def test_a_program_under_a_home_directory_keeps_home_read_only() -> None:
    options = DaemonOptions(python="/home/ada/venv/bin/python")
    assert "ProtectHome=read-only" in render_unit(daemon_unit(options, CPU_BOX)).splitlines()


def test_a_unit_that_cannot_be_rendered_says_why() -> None:
    bad = ServiceUnit(
        name="bad name",
        description="two\nlines",
        exec_start=("relative/python",),
        environment=(("1X", "v"),),
        watchdog_s=10,
    )
    problems = unit_problems(bad)
    assert len(problems) == 5, problems
    with pytest.raises(ValueError, match="absolute path"):
        render_unit(bad)
    with pytest.raises(ValueError, match="newline"):
        render_environment_dropin("x", [("A", "1\n[Service]\nUser=root")])


ARGS = st.text(
    st.characters(min_codepoint=32, max_codepoint=0x2FF, blacklist_characters="\x7f"), max_size=12
)


@settings(max_examples=25, deadline=None)
@given(st.lists(ARGS, max_size=4))
def test_any_argument_reaches_the_program_as_written(
    tmp_path_factory: pytest.TempPathFactory, args: list[str]
) -> None:
    """Blanks, quotes, backslashes, ``%`` and ``$`` in a config path or an argument reach
    the program unchanged: systemd's own parser reads back what was rendered."""
    tmp = tmp_path_factory.mktemp("unit")
    unit = ServiceUnit(name="argv", description="argv", exec_start=("/bin/true", *args))
    assert command_line(_write(tmp, unit)) == ["/bin/true", *args]


def test_another_program_is_one_more_description(tmp_path: Path) -> None:
    """The seam a cluster node's units use: a Ray runtime and a node agent are
    ServiceUnits like the daemon's, verified and written by the same code."""
    sandbox = Sandbox(read_write_paths=("/var/lib/accelmux",), devices=DEVICE_GROUPS["nvidia"])
    ray = ServiceUnit(
        name="accelmux-ray",
        description="Ray runtime of this accelmux cluster node",
        exec_start=(PYTHON, "-m", "ray.scripts.scripts", "start", "--block", "--address=h:6379"),
        user="accelmux",
        state_directory="accelmux",
        sandbox=sandbox,
    )
    agent = ServiceUnit(
        name="accelmux-node",
        description="accelmux node agent",
        exec_start=(PYTHON, "-m", "accelmux", "node", "--node", "kitchen", "-c", "/etc/a.yaml"),
        user="accelmux",
        after=("accelmux-ray.service",),
        wants=("accelmux-ray.service",),
        part_of=("accelmux-ray.service",),
        sandbox=sandbox,
    )
    root = tmp_path / "root"
    placement = Placement.of(user_mode=False, root=root)
    lines = install_units([ray, agent], placement, None, start=True)
    assert [line.split()[0] for line in lines] == ["wrote"] * 4  # 2 units, 2 drop-ins
    for unit in (ray, agent):
        done = verify(placement.unit_dir / unit.file_name)
        assert done.returncode == 0 and done.stdout + done.stderr == "", done.stderr


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return service_cli(*args, cwd=cwd)


def test_install_writes_the_unit_the_dropin_and_the_user_and_keeps_an_edited_dropin(
    tmp_path: Path,
) -> None:
    config = tmp_path / "accelmux.yaml"
    config.write_text((ROOT / "examples" / "fake-stack.yaml").read_text())
    root = tmp_path / "root"
    done = _cli("install", "--root", str(root), "-c", str(config), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    unit = root / "etc/systemd/system/accelmux.service"
    dropin = root / "etc/systemd/system/accelmux.service.d/environment.conf"
    sysusers = root / "etc/sysusers.d/accelmux.conf"
    assert done.stdout.splitlines() == [f"wrote {p}" for p in (unit, dropin, sysusers)]
    assert f"ExecStart={PYTHON} -m accelmux serve -c {config}" in unit.read_text()
    assert sysusers.read_text().splitlines()[-1].split()[:2] == ["u", "accelmux"]
    assert dropin.stat().st_mode & 0o777 == 0o600
    assert verify(unit).returncode == 0
    dropin.write_text("[Service]\nEnvironment=ACCELMUX_ADMIN_KEY=mine\n")
    again = _cli("install", "--root", str(root), "-c", str(config), cwd=tmp_path)
    assert again.returncode == 0 and str(dropin) not in again.stdout
    assert "ACCELMUX_ADMIN_KEY=mine" in dropin.read_text()
    gone = _cli("uninstall", "--root", str(root), cwd=tmp_path)
    assert gone.returncode == 0 and not unit.exists() and not dropin.parent.exists()


def test_install_refuses_a_bad_config_naming_its_problems(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump({"devices": {"gpu": {"kind": "tpu"}}}))
    done = _cli("install", "--print", "-c", str(config), cwd=tmp_path)
    assert done.returncode == 2
    assert "devices.gpu.kind" in done.stderr and "Traceback" not in done.stderr


def test_a_directory_others_cannot_pass_is_named() -> None:
    base = Path(tempfile.mkdtemp())  # under /tmp, which every user may pass
    private = base / "private"
    (private / "venv").mkdir(parents=True)
    program = private / "venv" / "python"
    program.write_text("")
    program.chmod(0o755)
    base.chmod(0o755)
    private.chmod(0o700)
    try:
        assert closed_to_others(program) == f"{private} (mode drwx------)"
        private.chmod(0o711)
        assert closed_to_others(program) is None
        program.chmod(0o700)
        assert closed_to_others(program) == f"{program} (mode -rwx------)"
        program.chmod(0o755)
        link = base / "python"  # a virtualenv's python: a link into a private place
        link.symlink_to(program)
        private.chmod(0o700)
        assert closed_to_others(link) == f"{private} (mode drwx------)"
    finally:
        private.chmod(0o755)
        shutil.rmtree(base)
