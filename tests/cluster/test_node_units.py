"""``accelmux service install --node NAME``: a cluster machine's units (its Ray node, its
node agent, a gateway) are valid for systemd, run what they say through systemd's own
parser, and keep the cluster's token in a file of the service user's alone, never in a
unit, an environment setting or a command line.

The two-machine tests (test_two_machines.py) run these units, as installed by the
command docs/cluster.md gives, when a machine boots."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests.install.support import command_line, service_cli, verify

from accelmux.service.daemon_unit import Machine
from accelmux.service.node_units import TOKEN_FILE, NodeOptions, node_units, ray_command
from accelmux.service.unit import render_unit

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
RAY = str(Path(PYTHON).parent / "ray")
GPU_BOX = Machine(device_families=("nvidia",), groups=("video", "render"), home="/root")
TOKEN = "4f1c0ffee-the-cluster-token-9d2"


def _options(**kw: object) -> NodeOptions:
    base: dict[str, object] = {
        "python": PYTHON,
        "ray": RAY,
        "node": "mini",
        "config": "/etc/accelmux/my cluster.yaml",
        "head": "192.168.1.10:6379",
        "address": "192.168.1.11",
        "device_mib": 16384,
        "gateway": True,
    }
    base.update(kw)
    return NodeOptions(**base)  # type: ignore[arg-type]


def _write_all(tmp_path: Path, options: NodeOptions) -> dict[str, Path]:
    out = {}
    for unit in node_units(options, GPU_BOX):
        path = tmp_path / unit.file_name
        path.write_text(render_unit(unit), encoding="utf-8")
        out[unit.name] = path
    return out


@pytest.mark.parametrize("user_mode", [False, True])
@pytest.mark.parametrize("is_head", [False, True])
def test_every_unit_passes_systemd_analyze_verify(
    tmp_path: Path, is_head: bool, user_mode: bool
) -> None:
    options = _options(is_head=is_head, user_mode=user_mode, address="192.168.1.10")
    units = _write_all(tmp_path, options)
    assert sorted(units) == ["accelmux-gateway", "accelmux-node", "accelmux-ray"]
    for path in units.values():
        done = verify(path, user=user_mode)
        assert done.returncode == 0 and done.stdout + done.stderr == "", done.stderr


def test_systemd_runs_the_commands_as_rendered(tmp_path: Path) -> None:
    """Read back through systemd's own parser: the Ray node's JSON resources, a config
    path with a blank, the head's address."""
    units = _write_all(tmp_path, _options())
    assert command_line(units["accelmux-ray"]) == [
        RAY,
        "start",
        "--block",
        "--address",
        "192.168.1.10:6379",
        "--node-ip-address",
        "192.168.1.11",
        "--num-cpus",
        "0",
        "--object-store-memory",
        "100000000",
        "--resources",
        '{"accelmux_device_mib": 16384}',
        "--disable-usage-stats",
    ]
    config = "/etc/accelmux/my cluster.yaml"
    assert command_line(units["accelmux-node"]) == [
        *(PYTHON, "-m", "accelmux", "node", "--node", "mini", "-c", config),
        *("--cluster", "192.168.1.10:6379"),
    ]
    assert command_line(units["accelmux-gateway"]) == [
        *(PYTHON, "-m", "accelmux", "serve", "-c", config, "--cluster", "192.168.1.10:6379"),
    ]


def test_the_head_starts_the_cluster_and_the_others_join_it() -> None:
    head = ray_command(_options(address="192.168.1.10", is_head=True, device_mib=0))
    assert head[2:8] == ("--block", "--head", "--port", "6379", "--include-dashboard", "false")
    assert "--resources" not in head and "--address" not in head


def test_the_units_come_back_by_themselves_and_the_agent_outlives_ray() -> None:
    """Restart=always; the agent wants Ray but does not stop with it (no PartOf, no
    BindsTo): its daemon serves whatever happens to Ray. A Ray node without its head ends
    after 15 s, so that its unit starts it again and it rejoins the head."""
    units = {u.name: render_unit(u) for u in node_units(_options(), GPU_BOX)}
    for text in units.values():
        lines = text.splitlines()
        assert "Restart=always" in lines and "User=accelmux" in lines
        assert "WorkingDirectory=/var/lib/accelmux" in lines
        assert f"Environment=RAY_AUTH_TOKEN_PATH={TOKEN_FILE}" in lines
        assert "Environment=RAY_AUTH_MODE=token" in lines
        assert "PartOf" not in text and "BindsTo" not in text
    assert "Environment=RAY_gcs_rpc_server_reconnect_timeout_s=15" in units["accelmux-ray"]
    assert "After=accelmux-ray.service" in units["accelmux-node"].splitlines()
    assert "SupplementaryGroups=video render" in units["accelmux-node"].splitlines()


# ---- the command ----------------------------------------------------------------------


def _setup(tmp_path: Path, **cluster: object) -> tuple[Path, Path]:
    data = yaml.safe_load((ROOT / "examples" / "cluster-fake.yaml").read_text())
    data["cluster"].update({"address": "127.0.0.1:6379", **cluster})
    config = tmp_path / "cluster.yaml"
    config.write_text(yaml.safe_dump(data))
    token = tmp_path / "home" / ".ray" / "auth_token"
    token.parent.mkdir(parents=True)
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    return config, token


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return service_cli(*args, cwd=cwd, HOME=str(cwd / "home"))


def test_install_node_writes_the_units_and_the_token_for_the_service_user_alone(
    tmp_path: Path,
) -> None:
    config, token = _setup(tmp_path)
    root = tmp_path / "root"
    done = _cli(
        *("install", "--node", "gpu-box", "-c", str(config), "--gateway"),
        *("--token-file", str(token), "--root", str(root)),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    units = root / "etc/systemd/system"
    written = sorted(p.name for p in units.glob("*.service"))
    assert written == ["accelmux-gateway.service", "accelmux-node.service", "accelmux-ray.service"]
    copy = root / TOKEN_FILE.lstrip("/")
    assert copy.read_text().strip() == TOKEN
    for path in (copy, copy.parent, root / "var/lib/accelmux"):
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
    # the token is nowhere else: not in a unit, a drop-in, the output
    assert TOKEN not in done.stdout + done.stderr
    for path in root.rglob("*"):
        if path.is_file() and path != copy:
            assert TOKEN not in path.read_text(), path
    ray = (units / "accelmux-ray.service").read_text()
    # this machine is the head: it reaches 127.0.0.1 from 127.0.0.1
    assert "--head --port 6379" in ray and '{\\"accelmux_device_mib\\": 8192}' in ray
    assert "node gpu-box: Ray on 127.0.0.1 (the Ray head)" in done.stdout
    for unit in units.glob("*.service"):
        assert verify(unit).returncode == 0
    shown = _cli(
        *("install", "--node", "gpu-box", "-c", str(config), "--print"),
        *("--token-file", str(token)),
        cwd=tmp_path,
    )
    assert shown.returncode == 0 and TOKEN not in shown.stdout + shown.stderr
    assert f"the token: {token} copied to {TOKEN_FILE} (mode 0600" in shown.stdout
    gone = _cli("uninstall", "--node", "--root", str(root), cwd=tmp_path)
    assert gone.returncode == 0 and list(units.glob("*.service")) == []


@pytest.mark.parametrize(
    ("args", "cluster", "expected"),
    [
        (("--node", "attic"), {}, "unknown node 'attic'"),
        (("--node", "mini", "--token-file", "nowhere"), {}, "no cluster token at"),
        (("--node", "mini"), {"address": None}, "set cluster.address"),
        (("--node", "mini", "--cluster", "auto"), {}, "set cluster.address"),
    ],
)
def test_install_node_refuses_what_cannot_work_in_one_line(
    tmp_path: Path, args: tuple[str, ...], cluster: dict[str, object], expected: str
) -> None:
    config, _ = _setup(tmp_path, **cluster)
    done = _cli("install", "-c", str(config), "--print", *args, cwd=tmp_path)
    assert done.returncode != 0 and expected in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_a_user_unit_reads_the_token_where_it_is_only_when_it_is_the_owners_alone(
    tmp_path: Path,
) -> None:
    config, token = _setup(tmp_path)
    token.chmod(0o644)
    args = ("install", "--user", "--node", "mini", "-c", str(config), "--print")
    done = _cli(*args, cwd=tmp_path)
    assert done.returncode == 1 and f"chmod 600 {token}" in done.stderr
    token.chmod(0o600)
    done = _cli(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"Environment=RAY_AUTH_TOKEN_PATH={token}" in done.stdout
    assert "User=" not in done.stdout and TOKEN not in done.stdout
