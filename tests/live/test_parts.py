"""Unit tests of the live parts: monitors, external-server supervision details, parsing
probes, auth helpers, the status view and the serve command's messages."""

from __future__ import annotations

import asyncio
import io
import os
import sys
import wave
from pathlib import Path

import pytest
from tests.live.support import UPSTREAM, live, pid_alive, run

from accelmux.backends.external import ExternalBackend, free_port, template_argv
from accelmux.backends.fake import FakeBackend
from accelmux.backends.fake_outputs import png
from accelmux.config.backends import ExternalBackendConfig, FakeBackendConfig
from accelmux.config.hosts import is_loopback
from accelmux.core.types import ServiceKind
from accelmux.errors import BackendError
from accelmux.gateway.media import audio_seconds, image_size
from accelmux.gateway.middleware import _matches
from accelmux.monitors.base import ServiceProcesses
from accelmux.monitors.host import HostSampler, host_total
from accelmux.monitors.nvidia import NvidiaSampler
from accelmux.monitors.process import tree_memory
from accelmux.monitors.virtual import VirtualSampler
from accelmux.runtime.status_cli import render

MIB = 1024**2
GIB = 1024**3


def test_template_argv_fills_and_names_unknown_placeholders() -> None:
    values = {"port": 9000, "ctx_size": 4096, "parallel": 2}
    assert template_argv(["srv", "--port", "{port}", "-c", "{ctx_size}"], values) == [
        "srv",
        "--port",
        "9000",
        "-c",
        "4096",
    ]
    assert template_argv(["{{literal}}"], values) == ["{literal}"]
    with pytest.raises(BackendError, match="nope"):
        template_argv(["{nope}"], values)


def test_external_env_pins_the_gpu_and_keeps_config_env() -> None:
    cfg = ExternalBackendConfig(type="external", argv=["x"], env={"FOO": "1"})
    backend = ExternalBackend("s", "m", cfg, gpu_index=1)
    env = backend._env()
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["FOO"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in ExternalBackend("s", "m", cfg)._env() or os.environ.get(
        "CUDA_VISIBLE_DEVICES"
    )


def test_external_ctx_size_from_kv_pool() -> None:
    cfg = ExternalBackendConfig(type="external", argv=["x"], ctx_size=777)
    b = ExternalBackend("s", "m", cfg, kv_bytes_per_token=1024, concurrency=3)
    assert b._values(1)["ctx_size"] == 777  # nothing granted yet: the configured default
    b.kv_pool_bytes = 8 * MIB
    assert b._values(1)["ctx_size"] == 8192 and b._values(1)["parallel"] == 3


def test_external_load_failure_reports_exit_and_output(tmp_path: Path) -> None:
    cfg = ExternalBackendConfig(
        type="external",
        argv=[sys.executable, "-c", "print('bad model file'); raise SystemExit(4)"],
        startup_timeout_s=10,
    )

    async def body() -> None:
        b = ExternalBackend("s", "m", cfg, data_dir=tmp_path)
        try:
            with pytest.raises(BackendError, match=r"code 4.*bad model file"):
                await b.load(weights_bytes=0, runtime_bytes=0, kv_pool_bytes=0)
        finally:
            await b.close()
        assert "bad model file" in (tmp_path / "logs" / "s.log").read_text()

    run(body())


def test_external_startup_timeout_kills_the_group(tmp_path: Path) -> None:
    cfg = ExternalBackendConfig(
        type="external",
        argv=[sys.executable, str(UPSTREAM), "--port", "{port}", "--startup-delay", "30"],
        startup_timeout_s=1.0,
        stop_grace_s=1.0,
    )

    async def body() -> None:
        b = ExternalBackend("s", "m", cfg, data_dir=tmp_path)
        try:
            with pytest.raises(BackendError, match="not healthy"):
                await b.load(weights_bytes=0, runtime_bytes=0, kv_pool_bytes=0)
            assert b.pids() == []
        finally:
            await b.close()

    run(body())


def test_external_unload_stops_child_and_reports_no_crash(tmp_path: Path) -> None:
    cfg = ExternalBackendConfig(
        type="external", argv=[sys.executable, str(UPSTREAM), "--port", "{port}"]
    )
    crashes: list[str] = []

    async def body() -> None:
        b = ExternalBackend("s", "m", cfg, data_dir=tmp_path)
        b.set_crash_callback(crashes.append)
        try:
            await b.load(weights_bytes=0, runtime_bytes=0, kv_pool_bytes=0)
            (pid,) = b.pids()
            assert pid_alive(pid) and tree_memory(pid) > 0
            await b.unload()
            assert not pid_alive(pid)
        finally:
            await b.close()

    run(body())
    assert crashes == []


def test_fake_backend_really_allocates_and_frees() -> None:
    cfg = FakeBackendConfig(type="fake", load_s=0, latency_s=0)
    fake = FakeBackend("f", ServiceKind.IMAGE, "f", cfg, profile=(64 * MIB, 0))

    async def body() -> None:
        await fake.load(weights_bytes=1, runtime_bytes=0, kv_pool_bytes=0)
        assert fake.memory_bytes() == 64 * MIB
        await fake.unload()
        assert fake.memory_bytes() == 0

    run(body())


def test_host_sampler_measures_and_defines_foreign() -> None:
    total = host_total()
    sampler = HostSampler("host", capacity=total, budget=total // 2)
    sample = sampler.sample([ServiceProcesses(service="a", inprocess_bytes=10 * MIB)])
    ev = sample.event
    assert 0 < ev.used_bytes <= total
    assert ev.per_service == {"a": 10 * MIB}
    assert ev.baseline_bytes >= total - total // 2  # the slack outside the budget
    foreign = sample.details["foreign_bytes"]
    assert foreign == max(0, ev.used_bytes - 10 * MIB - ev.baseline_bytes)


def test_virtual_sampler_sums_services() -> None:
    sample = VirtualSampler("v", capacity=GIB).sample(
        [ServiceProcesses(service="a", inprocess_bytes=5), ServiceProcesses(service="b")]
    )
    assert sample.event.used_bytes == 5 and sample.event.per_service == {"a": 5, "b": 0}


def test_nvidia_sampler_never_crashes_without_a_gpu() -> None:
    sampler = NvidiaSampler("gpu", index=0, capacity=GIB, budget=GIB)
    sample = sampler.sample([ServiceProcesses(service="a", pids=[os.getpid()])])
    if sample is None:
        assert sampler.error
    else:  # a machine with a GPU
        assert sample.event.used_bytes >= 0
    sampler.close()


def test_media_probes() -> None:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"\x00\x00" * 8000 * 3)
    assert audio_seconds(buf.getvalue()) == pytest.approx(3.0)
    assert audio_seconds(b"x" * 64000) == pytest.approx(2.0)
    assert image_size(png(b"abcd" * 8, 30, 20)) == (30, 20)
    jpeg = b"\xff\xd8\xff\xe0\x00\x04ab" + b"\xff\xc0\x00\x11\x08\x00\x78\x00\xa0" + b"\x00" * 12
    assert image_size(jpeg) == (160, 120)
    assert image_size(b"not an image") is None


def test_auth_helpers() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2") and not is_loopback("")
    assert _matches(b"k2", [b"k1", b"k2"]) and not _matches(b"k3", [b"k1"])
    assert not _matches(None, [b"k1"])


def test_free_port_is_bindable() -> None:
    assert 0 < free_port() < 65536


def test_status_view_answers_why_memory_is_full(tmp_path: Path) -> None:
    async def body() -> str:
        async with live(tmp=tmp_path) as lv:
            await lv.post(
                "/v1/chat/completions",
                json={"model": "chat", "messages": [{"role": "user", "content": "x"}]},
            )
            from accelmux.runtime.status_cli import fetch

            data = await asyncio.to_thread(fetch, lv.url, None)
            return render(data)

    text = run(body())
    assert "SERVICE" in text and "WEIGHTS+RT" in text and "RESERVED" in text
    assert "why:" in text and "held by idle loaded services" in text
    assert "last decisions:" in text and "dispatch" in text


def test_serve_without_config_shows_the_default_stack(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from accelmux.cli import main

    code = main(["serve", "--show-config"])
    out = capsys.readouterr()
    if code == 0:  # the real models are installed: the default stack's config
        assert "kind: host" in out.out and "type: worker" in out.out
    else:  # they are not: it says how to get them
        assert code == 2 and "setup-models.sh" in out.err


def test_status_cli_reports_unreachable(capsys: pytest.CaptureFixture[str]) -> None:
    from accelmux.cli import main

    port = free_port()
    assert main(["status", "--url", f"http://127.0.0.1:{port}"]) == 1
    assert "cannot reach" in capsys.readouterr().err


def test_external_asr_multipart_is_proxied_with_filename_and_upstream_model(
    tmp_path: Path,
) -> None:
    from tests.live.support import base_config

    cfg = base_config(
        asr={
            "kind": "asr",
            "memory": {"weights": "64MiB"},
            "backend": {
                "type": "external",
                "argv": [sys.executable, str(UPSTREAM), "--port", "{port}"],
                "upstream_model": "whisper-small",
            },
        }
    )

    async def body() -> None:
        async with live(cfg, tmp=tmp_path) as lv:
            client = lv.openai()
            try:
                out = await client.audio.transcriptions.create(
                    model="asr",
                    file=("hello.wav", b"RIFF\x00\x00\x00\x00WAVE" + b"\x00" * 92, "audio/wav"),
                )
            finally:
                await client.close()
            assert out.text == "upstream heard hello.wav (audio/wav, 104 bytes) model=whisper-small"

    run(body())


def test_status_view_names_learned_sizes_and_frames_held_for_voice() -> None:
    from accelmux.runtime.status_cli import learned_lines

    lines = learned_lines(
        [
            {
                "name": "chat",
                "learned_size": {
                    "bytes": 5 * 1024**3,
                    "evidence": "asked 5368709120 B, granted 3221225472 B",
                    "learned_at": 12.0,
                    "retest_at": 312.0,
                    "failures": 1,
                    "testing": False,
                },
            },
            {"name": "camera", "held_for_realtime": 12, "skipped_for_realtime": 3},
            {"name": "tts"},
        ]
    )
    assert len(lines) == 2
    assert "chat: learned to need" in lines[0] and "re-tested at t=312" in lines[0]
    assert "camera: 12 request(s) held" in lines[1] and "3 of them skipped" in lines[1]
