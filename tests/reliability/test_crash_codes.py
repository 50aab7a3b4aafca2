"""An external server that dies with a request in flight: the client is told
``backend_crashed`` (502, Retry-After), the name the decision log gives it, whichever of
the two the daemon notices first (the request's connection breaking, or the process
exit). And README's error table names every code the gateway can answer."""

from __future__ import annotations

import ast
import os
import re
import signal
import threading
from pathlib import Path
from typing import Any

import openai
import pytest
from tests.live.support import base_config
from tests.reliability.support import external_chat, http, running, wait_for, write_config
from tests.reliability.test_hardening import ROOT, SRC, _emitted_codes, _string_constants


@pytest.mark.parametrize("stream", [False, True])
def test_an_external_server_dying_mid_request_answers_backend_crashed(
    tmp_path: Path, stream: bool
) -> None:
    cfg = base_config(ext=external_chat())
    path = write_config(cfg, tmp_path)
    pid_file = tmp_path / "data" / "run" / "ext.pid"
    with (
        running(path, timeout=60) as d,
        openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0) as client,
    ):
        caught: list[BaseException] = []
        chunks: list[Any] = []

        def ask() -> None:
            try:
                if stream:
                    for chunk in client.chat.completions.create(
                        model="ext", messages=[{"role": "user", "content": "sleep:30"}], stream=True
                    ):
                        chunks.append(chunk)
                else:
                    client.chat.completions.create(
                        model="ext", messages=[{"role": "user", "content": "sleep:30"}]
                    )
            except BaseException as exc:  # examined below
                caught.append(exc)

        asker = threading.Thread(target=ask)
        asker.start()

        def in_flight() -> bool:
            _, status, _ = http("GET", d.url + "/admin/status")
            svc = next(s for s in status["services"] if s["name"] == "ext")
            return bool(svc["inflight"])

        wait_for(in_flight, timeout=30)
        pid = int(pid_file.read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        asker.join(timeout=60)
        assert not asker.is_alive()
    [exc] = caught
    if stream:
        assert isinstance(exc, openai.APIError), repr(exc)
        assert exc.code == "backend_crashed", (exc, exc.body)
    else:
        assert isinstance(exc, openai.APIStatusError), repr(exc)
        assert exc.status_code == 502, exc
        assert exc.code == "backend_crashed", exc.body
        assert exc.response.headers.get("Retry-After"), exc.response.headers


def _readme_error_table() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("### Errors", 1)[1]
    return section.split("\n## ", 1)[0]


def test_the_readme_error_table_names_every_code_the_gateway_answers() -> None:
    codes = _emitted_codes()
    # a hosted or external backend's own error code is passed through: the test double's
    fake = ast.parse((SRC / "backends" / "fake.py").read_text())
    for node in ast.walk(fake):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "code":
                    codes |= _string_constants(value)
    assert "unsupported" in codes and "backend_crashed" in codes
    documented = set(re.findall(r"`([a-z_]+)`", _readme_error_table()))
    missing = sorted(codes - documented)
    assert not missing, f"codes the gateway answers that README's error table lacks: {missing}"
