"""``accelmux top`` in a real terminal (a tmux pane) against a live daemon."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from tests.ui.support import live_daemon, need_tmux, stack_config, wait_until

from accelmux.runtime import top


class Pane:
    def __init__(self, tmux: str, command: str) -> None:
        self.socket = f"accelmux-top-{uuid.uuid4().hex[:8]}"
        self.base = [tmux, "-L", self.socket, "-f", "/dev/null"]
        wrapped = f"{command}; echo TOP-EXIT=$?; sleep 60"
        env = dict(os.environ, TERM="xterm-256color")
        subprocess.run(
            [*self.base, "new-session", "-d", "-s", "top", "-x", "150", "-y", "48", wrapped],
            check=True,
            env=env,
        )

    def text(self) -> str:
        out = subprocess.run(
            [*self.base, "capture-pane", "-p", "-t", "top"],
            check=False,
            capture_output=True,
            text=True,
        )
        return out.stdout

    def keys(self, *keys: str) -> None:
        subprocess.run([*self.base, "send-keys", "-t", "top", *keys], check=True)

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], check=False, capture_output=True)


@pytest.fixture
def pane_factory() -> Iterator[Any]:
    tmux = need_tmux()
    panes: list[Pane] = []

    def make(command: str) -> Pane:
        pane = Pane(tmux, command)
        panes.append(pane)
        return pane

    yield make
    for pane in panes:
        pane.close()


def _top_command(url: str, *extra: str) -> str:
    argv = [sys.executable, "-m", "accelmux.runtime.top", "--url", url, "--interval", "0.3"]
    return shlex.join([*argv, *extra])


def test_top_shows_services_follows_changes_and_quits(pane_factory: Any) -> None:
    with live_daemon() as d:
        pane = pane_factory(_top_command(d.url))
        wait_until(lambda: "SERVICE" in pane.text(), timeout=15, what="top drew its table")
        screen = pane.text()
        for name in ("chat", "embeddings", "image", "asr", "tts", "detect"):
            assert name in screen, screen
        rows = {p[0]: p[1] for p in (line.split() for line in screen.splitlines()) if len(p) > 1}
        assert rows["chat"] == "loaded" and rows["image"] == "unloaded", screen
        assert "why:" in screen and "LAST DECISIONS" in screen
        window = d.config["services"]["embeddings"]["windows"][0]
        assert f"embeddings {window} (closed)" in screen
        d.call(d.post("/admin/services/image/load"))

        def image_state() -> str:
            for line in pane.text().splitlines():
                parts = line.split()
                if parts and parts[0] == "image":
                    return parts[1]
            return ""

        wait_until(lambda: image_state() == "loaded", what="top shows image loaded")
        pane.keys("q")
        wait_until(lambda: "TOP-EXIT=0" in pane.text(), what="top quit on q")
        assert "Traceback" not in pane.text()


def test_top_reports_an_unreachable_daemon_without_traceback() -> None:
    with live_daemon(stack_config()) as d:
        url = d.url
    out = subprocess.run(
        [sys.executable, "-m", "accelmux.runtime.top", "--url", url, "--once"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 1
    assert f"accelmux top: cannot reach {url}" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout


def test_top_once_prints_one_frame() -> None:
    with live_daemon() as d:
        out = subprocess.run(
            [sys.executable, "-m", "accelmux.runtime.top", "--url", d.url, "--once"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert out.returncode == 0, out.stderr
    assert "C=chat" in out.stdout and "#=foreign" in out.stdout
    assert "asr         loaded    pin" in out.stdout


def _service(name: str, state: str, ledger: dict[str, int]) -> dict[str, Any]:
    """One service of an ``/admin/status`` answer, on device ``gpu``."""
    return {
        "name": name,
        "device": "gpu",
        "state": state,
        "class": "interactive",
        "residency": "warm",
        "pinned": False,
        "ledger": ledger,
        "inflight": 0,
        "concurrency": 1,
        "waiting": 0,
        "kv_pool_bytes": 0,
        "kv_in_use_bytes": 0,
        "loads": 1,
        "evictions": 0,
        "thrash": 0,
        "cold_starts": 0,
        "served": 0,
        "windows": [],
    }


def test_frame_letters_stay_distinct_and_fit_the_width() -> None:
    assert top.letters(["chat", "completion", "camera", "c"]) == {
        "chat": "C",
        "completion": "O",
        "camera": "A",
        "c": "0",
    }
    status: dict[str, Any] = {
        "time": 10.0,
        "devices": [
            {
                "name": "gpu",
                "kind": "virtual",
                "capacity_bytes": 1000,
                "budget_bytes": 1000,
                "headroom_bytes": 100,
                "foreign_bytes": 200,
                "committed_bytes": 300,
                "available_bytes": 400,
            }
        ],
        "services": [{**_service("chat", "loaded", {"weights": 300}), "served": 3}],
        "queues": {},
        "decisions": [{"t": 9.0, "action": "reject", "service": "chat", "reason": "queue_full"}],
    }
    lines = top.frame(top.View(url="http://x", status=status), 60, 40)
    text = top.plain(lines)
    assert all(len(line) <= 60 for line in text.splitlines())
    bar = next(line for line in text.splitlines() if line.strip().startswith("["))
    # 30% chat, 20% foreign, 40% free, 10% headroom of 56 cells
    assert bar.count("C") == 17 and bar.count("#") == 11 and bar.count(":") == 6
    assert "reject" in text and "queue_full" in text


def test_frame_shows_every_byte_the_ledger_attributes() -> None:
    device = {
        "name": "gpu",
        "kind": "nvidia",
        "capacity_bytes": 1000,
        "budget_bytes": 1000,
        "headroom_bytes": 100,
        "foreign_bytes": 100,
        "committed_bytes": 300,  # chat's weights and the leftover of a stopped service
        "overhead_bytes": 200,
        "parked_bytes": 100,
        "available_bytes": 200,
    }

    status: dict[str, Any] = {
        "time": 10.0,
        "devices": [device],
        "services": [
            _service("chat", "loaded", {"weights": 200}),
            _service("vllm", "unloaded", {"leftover": 100}),
        ],
        "queues": {},
        "decisions": [],
    }
    text = top.plain(top.frame(top.View(url="http://x", status=status), 60, 40))
    bar = next(line for line in text.splitlines() if line.strip().startswith("["))
    # of 56 cells: chat 20%, vllm's leftover 10%, overhead 20%, parked 10%, foreign 10%
    # (cells are rounded on the running total: 11, 6, 11, 6, 5)
    assert bar.count("o") == 11 and bar.count("p") == 6 and bar.count("#") == 5
    assert bar.count("C") == 11 and bar.count("V") == 6
    flat = " ".join(text.split())
    assert "100B left over by unloaded services" in flat
    assert "200B workers' overhead" in flat and "100B parked" in flat
    assert "o=overhead p=parked" in text
