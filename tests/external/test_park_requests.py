"""``park: llama-server`` without a server: which requests can be paused, what reaches
llama-server's ``/completion`` of their settings, what the config asks of the argv, and
what a server without ``park`` answers to a pause."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.live.support import run

from accelmux.backends.base import BackendRequest
from accelmux.backends.external import ExternalBackend
from accelmux.backends.pausable import sampling, why_not_pausable
from accelmux.backends.slot_park import slot_dir
from accelmux.config.backends import ExternalBackendConfig
from accelmux.config.load import load_config_data
from accelmux.core.types import ServiceKind
from accelmux.errors import BackendError, ConfigError


def _request(endpoint: str = "/v1/completions", stream: bool = True, **body: Any) -> BackendRequest:
    return BackendRequest(
        request_id="r", service="chat", kind=ServiceKind.CHAT, endpoint=endpoint,
        body={"model": "chat", **body}, stream=stream,
    )  # fmt: skip


def test_which_requests_can_be_paused() -> None:
    assert why_not_pausable(_request(prompt="hi")) is None
    assert why_not_pausable(_request(prompt=[1, 2, 3])) is None
    chat = "/v1/chat/completions"
    assert why_not_pausable(_request(chat, messages=[{"role": "user", "content": "x"}])) is None
    assert why_not_pausable(_request(prompt="hi", stream=False)) == "not a stream"
    assert why_not_pausable(_request(prompt=["a", "b"])) == (
        "its prompt is not one string or one list of token ids"
    )
    assert why_not_pausable(_request(prompt="hi", logprobs=2, echo=True)) == (
        "it names echo, logprobs"
    )
    assert why_not_pausable(_request(prompt="hi", n=2)) == "it asks for more than one choice"
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert why_not_pausable(_request(chat, messages=[], tools=tools)) == "it names tools"
    assert why_not_pausable(_request("/v1/embeddings", input="x")) is not None


def test_sampling_settings_pass_under_the_same_names() -> None:
    body = {
        "model": "chat", "prompt": "hi", "stream": True, "max_tokens": 9, "temperature": 0,
        "top_p": 0.5, "seed": 7, "stop": "\n", "stream_options": {"include_usage": True},
        "_internal": 1,
    }  # fmt: skip
    assert sampling(body) == {"temperature": 0, "top_p": 0.5, "seed": 7, "stop": ["\n"]}


def _config(backend: dict[str, Any], kind: str = "chat") -> dict[str, Any]:
    return {
        "devices": {"cpu": {"kind": "virtual", "capacity": "1GiB"}},
        "services": {
            "chat": {
                "kind": kind,
                "memory": {"weights": "64MiB"},
                "backend": {"type": "external", **backend},
            }
        },
    }


def test_park_needs_the_slot_save_path_and_an_llm() -> None:
    argv = ["llama-server", "-m", "m.gguf", "--port", "{port}"]
    with pytest.raises(ConfigError, match=r"needs --slot-save-path \{slot_save_path\}"):
        load_config_data(_config({"argv": argv, "park": "llama-server"}), "test")
    argv += ["--slot-save-path", "{slot_save_path}"]
    with pytest.raises(ConfigError, match="park: llama-server is for LLM services"):
        load_config_data(_config({"argv": argv, "park": "llama-server"}, "embeddings"), "test")
    cfg = load_config_data(_config({"argv": argv, "park": "llama-server"}), "test")
    section = cfg.services["chat"].backend
    assert isinstance(section, ExternalBackendConfig)
    caps = section.capabilities()
    assert caps.pause and caps.park and not caps.sleep
    plain = ExternalBackendConfig(type="external", argv=argv)
    assert not plain.capabilities().pause and not plain.capabilities().park


def test_the_slot_directory_is_under_the_data_dir(tmp_path: Path) -> None:
    assert slot_dir(tmp_path, "chat") == tmp_path / "slots" / "chat"
    section = ExternalBackendConfig(
        type="external", argv=["llama-server", "--slot-save-path", "{slot_save_path}"]
    )
    backend = ExternalBackend("chat", "chat", section, data_dir=tmp_path)
    assert backend._values(1)["slot_save_path"] == str(tmp_path / "slots" / "chat")


def test_a_server_without_park_refuses_pause_and_resume(tmp_path: Path) -> None:
    section = ExternalBackendConfig(type="external", argv=["llama-server"])
    backend = ExternalBackend("chat", "chat", section, data_dir=tmp_path)

    async def body() -> None:
        with pytest.raises(BackendError, match="does not declare pause"):
            await backend.pause("r", park=True)
        with pytest.raises(BackendError, match="does not declare pause"):
            await backend.resume("r")

    run(body())
