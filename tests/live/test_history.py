"""The daemon's request history, recorded by a real daemon (fake backends, real HTTP)."""

from __future__ import annotations

import os
import signal
import stat
import time
from pathlib import Path

import openai
import pytest

from accelmux.cli import main
from accelmux.history.store import history_files, read_history

from .support import base_config, daemon, fake

SECRET_PROMPT = "the-pineapple-is-in-the-attic-7731"
SECRET_TEXT = "my-bank-pin-is-0000-4242"


def config() -> dict:
    cfg = base_config()
    cfg["services"]["chat"]["backend"] = fake(latency_s=0.02, stream_chunk_s=0.005)
    return cfg


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


def traffic(url: str) -> None:
    c = client(url)
    stream = c.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": SECRET_PROMPT}],
        max_tokens=12,
        stream=True,
    )
    chunks = sum(1 for _ in stream)
    assert chunks > 1
    c.embeddings.create(model="embed", input=[SECRET_TEXT, "another"])
    c.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    with pytest.raises(openai.APIStatusError):  # more KV than the pool can ever hold
        c.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "x"}], max_tokens=200_000
        )
    c.close()


def test_the_daemon_records_sizes_times_and_outcomes_never_text(tmp_path: Path) -> None:
    with daemon(config(), tmp_path) as d:
        traffic(d.url)
    h = read_history(d.data_dir / "history")
    by_service = {}
    for r in h.requests:
        by_service.setdefault(r.service, []).append(r)
    streamed = [r for r in by_service["chat"] if r.stream]
    assert len(streamed) == 1
    s = streamed[0]
    assert s.outcome == "ok" and s.t_arrived <= s.t_dispatched <= s.t_first_token <= s.t_finished
    assert s.output_tokens and s.output_tokens > 1 and s.max_output_tokens == 12
    assert s.prompt_tokens > 0 and s.cls == "interactive" and s.origin == "http"
    refused = [r for r in by_service["chat"] if r.outcome == "rejected"]
    assert len(refused) == 1 and refused[0].reason == "too_large"
    (embed,) = by_service["embed"]
    assert embed.units == 2 and embed.outcome == "ok" and embed.cls == "batch"
    assert {ld.service for ld in h.loads} >= {"asr", "chat", "embed"}
    assert all(ld.ok and ld.t_end is not None for ld in h.loads)
    assert h.samples and all(s.device == "gpu" for s in h.samples)
    assert any(d.action == "load" for d in h.decisions)
    for path in (d.data_dir / "history").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        blob = path.read_bytes()
        for secret in (SECRET_PROMPT, SECRET_TEXT):
            assert secret.encode() not in blob, f"{secret} written into {path.name}"
    out = str(tmp_path / "e")
    assert main(["history", "export", "--data-dir", str(d.data_dir), "--out", out]) == 0
    assert (tmp_path / "e" / "requests.csv").read_text().count("\n") == len(h.requests) + 2


def test_a_daemon_killed_mid_run_leaves_a_readable_history(tmp_path: Path) -> None:
    with daemon(config(), tmp_path) as d:
        traffic(d.url)
        time.sleep(3.0)  # a memory sample flushes what the recorder holds
        os.kill(d.proc.pid, signal.SIGKILL)
        d.proc.wait(10)
    files = history_files(d.data_dir / "history")
    assert files
    h = read_history(d.data_dir / "history")
    assert sum(1 for r in h.requests if r.service == "chat") >= 2
    assert not h.problems


def test_history_off_records_nothing(tmp_path: Path) -> None:
    cfg = config()
    cfg["server"]["history"] = {"enabled": False}
    with daemon(cfg, tmp_path) as d:
        traffic(d.url)
    assert not (d.data_dir / "history").exists()
