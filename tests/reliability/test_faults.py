"""Faults, each driven through HTTP against a live daemon (the gateway, the Manager and
fake backends with their fault-injection knobs, in this process; monitors on where the
case needs them): a crash mid-request, a failed load, a hung load, a foreign memory hog
and requests that use more memory than estimated."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.live.support import Live, base_config, fake, live, run
from tests.reliability.conftest import Record
from tests.waiting import async_wait_until

MIB = 1024**2
MSG = [{"role": "user", "content": "hello"}]


async def _chat(lv: Live, model: str = "chat", **extra: Any) -> tuple[int, Any, Any]:
    return await lv.post(
        "/v1/chat/completions", json={"model": model, "messages": MSG, "max_tokens": 8, **extra}
    )


async def _status(lv: Live) -> dict[str, Any]:
    status, body = await lv.get("/admin/status")
    assert status == 200
    return dict(body)


def _svc(status: dict[str, Any], name: str) -> dict[str, Any]:
    return dict(next(s for s in status["services"] if s["name"] == name))


async def _until_inflight(lv: Live, count: int, name: str = "chat") -> None:
    await async_wait_until(
        lambda: len(lv.runtime.manager.world.services[name].inflight) == count,
        message=f"{count} {name} request(s) in flight",
    )


def _leases(status: dict[str, Any], name: str) -> int:
    return int(_svc(status, name)["ledger"]["active"])


def test_backend_crash_mid_request(tmp_path: Path, record: Record) -> None:
    cfg = base_config(
        chat={
            "kind": "chat",
            "concurrency": 2,
            "memory": {"weights": "256MiB", "kv_per_token": "16KiB", "kv_ceiling": "64MiB"},
            "backend": fake(latency_s=1.0, crash_after_requests=3),
        }
    )

    async def body() -> None:
        async with live(cfg, tmp=tmp_path) as lv:
            answers = [await _chat(lv), await _chat(lv)]  # 1 and 2: before the fault
            crasher = asyncio.create_task(_chat(lv))  # 3 crashes the backend as it ends
            await _until_inflight(lv, 1)
            inflight = asyncio.create_task(_chat(lv))  # 4 runs beside it
            await _until_inflight(lv, 2)
            queued = [asyncio.create_task(_chat(lv)) for _ in range(2)]  # 5, 6 wait (2/2)
            answers += [await crasher, await inflight, *await asyncio.gather(*queued)]
            statuses = [a[0] for a in answers]
            failed = [a for a in answers if a[0] != 200]
            st = await _status(lv)
            chat = _svc(st, "chat")
            assert statuses[:2] == [200, 200], answers
            assert failed and all(a[0] in (502, 503) for a in failed), answers
            for _code, err, headers in failed:
                assert err["error"]["code"] in ("backend_crashed", "backend_error"), err
                assert "Retry-After" in headers
            assert statuses[2:4] == [502, 502], answers  # both in flight at the crash
            assert statuses[-2:] == [200, 200], answers  # queued ones served after restart
            assert chat["crashes"] == 1 and chat["state"] == "loaded", chat
            assert _leases(st, "chat") == 0 and chat["inflight"] == 0
            assert "crash" in (chat["last_error"] or "")
            log = [d.as_dict() for d in lv.runtime.manager.log]
            crashed_at = min(d["t"] for d in log if d.get("reason") == "backend_crashed")
            reload_at = min(d["t"] for d in log if d.get("reason") == "reload_after_crash")
            backoff = reload_at - crashed_at
            assert backoff >= 0.2 - 0.01, backoff  # policy.crash_backoff_s
            # the ledger holds the reloaded service and no lease of a failed request
            ledger = chat["ledger"]
            assert st["devices"][0]["decided_bytes"] == sum(
                ledger[c] for c in ("weights", "runtime", "kv", "active")
            )
            record(
                area="fault",
                case="a backend crashes with requests in flight",
                expected="in-flight requests get a clear 502/503, the service restarts with "
                "backoff, queued requests are served, the ledger is released",
                happened=f"statuses {statuses}; failed ones carry "
                f"{sorted({a[1]['error']['code'] for a in failed})} and Retry-After; "
                f"restarted after a {backoff:.2f}s backoff (crashes=1, loads={chat['loads']}); "
                "the queued ones were served by the new instance; 0 leases left",
                lost=f"{len(failed)} in-flight requests answered with an error (the client "
                "may retry); nothing queued was lost",
            )

    run(body())


def test_load_fails_rolls_back(tmp_path: Path, record: Record) -> None:
    cfg = base_config(
        chat={"kind": "chat", "memory": {"weights": "1GiB"}, "backend": fake(fail_load=True)},
        embed={"kind": "embeddings", "memory": {"weights": "64MiB"}, "backend": fake()},
    )

    async def body() -> None:
        async with live(cfg, tmp=tmp_path) as lv:
            before = (await _status(lv))["devices"][0]["decided_bytes"]
            status, err, headers = await _chat(lv)
            assert status == 503, err
            assert err["error"]["code"] == "load_failed"
            assert "configured to fail its load" in err["error"]["message"]
            assert int(headers["Retry-After"]) >= 1
            st = await _status(lv)
            chat = _svc(st, "chat")
            assert chat["state"] in ("crashed", "unloaded"), chat
            assert sum(chat["ledger"].values()) == 0, chat["ledger"]
            assert st["devices"][0]["decided_bytes"] == before
            assert "configured to fail its load" in chat["last_error"]
            # the other services are untouched
            ok, _, _ = await lv.post("/v1/embeddings", json={"model": "embed", "input": "x"})
            assert ok == 200
            record(
                area="fault",
                case="a load fails",
                expected="the ledger is rolled back and the reason is shown",
                happened=f"503 load_failed '{err['error']['message'][:60]}...', Retry-After "
                f"{headers['Retry-After']}s; ledger of the service back to 0 B; reason in "
                "/admin/status last_error; other services keep serving",
            )

    run(body())


def test_load_hangs_times_out(tmp_path: Path, record: Record) -> None:
    cfg = base_config(
        chat={
            "kind": "chat",
            "load_timeout_s": 0.5,
            "memory": {"weights": "1GiB"},
            "backend": fake(hang_load=True),
        }
    )

    async def body() -> None:
        async with live(cfg, tmp=tmp_path) as lv:
            started = time.monotonic()
            status, err, _ = await _chat(lv)
            waited = time.monotonic() - started
            assert status == 503, err
            assert err["error"]["code"] == "load_failed"
            assert "timed out after 0.5s" in err["error"]["message"], err
            assert waited < 10, waited
            chat = _svc(await _status(lv), "chat")
            assert sum(chat["ledger"].values()) == 0 and "timed out" in chat["last_error"]
            record(
                area="fault",
                case="a load hangs",
                expected="a timeout fires (load_timeout_s, every backend type)",
                happened=f"503 load_failed 'load timed out after 0.5s' after {waited:.2f}s; "
                "ledger rolled back",
                waited_s=round(waited, 2),
            )

    run(body())


HOG = """
import os, sys, time
n = int(sys.argv[2])
block = bytearray(b"\\x01") * n
open(os.path.join(sys.argv[1], "hog.pid.tmp"), "w").write(str(os.getpid()))
os.replace(os.path.join(sys.argv[1], "hog.pid.tmp"), os.path.join(sys.argv[1], "hog.pid"))
print("ready", flush=True)
deadline = time.monotonic() + 60  # bounded: ends by itself
while time.monotonic() < deadline and sys.stdin.readline():
    pass
"""


def test_foreign_process_grabs_memory(tmp_path: Path, record: Record) -> None:
    pid_dir = tmp_path / "foreign"
    pid_dir.mkdir()
    cfg = base_config(
        asr={
            "kind": "asr",
            "class": "realtime",
            "residency": "pinned",
            "memory": {"weights": "256MiB", "per_unit": "1MiB"},
            "backend": fake(),
        },
        chat={"kind": "chat", "memory": {"weights": "1GiB"}, "backend": fake()},
        image={
            "kind": "image",
            "residency": "on-demand",
            "memory": {"weights": "512MiB", "per_unit": "16MiB"},
            "backend": fake(),
        },
    )
    cfg["devices"]["gpu"].update(
        {"capacity": "3GiB", "headroom": "256MiB", "foreign_pid_dir": str(pid_dir)}
    )
    cfg["server"]["sample_interval_s"] = 0.05
    hog_bytes = 1536 * MIB

    async def body() -> None:
        async with live(cfg, tmp=tmp_path, sample=True) as lv:
            assert (await _chat(lv))[0] == 200
            img = {"model": "image", "prompt": "x", "size": "64x64"}
            assert (await lv.post("/v1/images/generations", json=img))[0] == 200
            st = await _status(lv)
            assert all(_svc(st, n)["state"] == "loaded" for n in ("asr", "chat", "image"))
            hog = subprocess.Popen(
                [sys.executable, "-c", HOG, str(pid_dir), str(hog_bytes)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                assert hog.stdout is not None
                line = await asyncio.to_thread(hog.stdout.readline)
                assert line.strip() == "ready"
                dev: dict[str, Any] = {}
                worst = 0
                for _ in range(200):  # until the Manager has given memory back
                    st = await _status(lv)
                    dev = st["devices"][0]
                    usable = dev["budget_bytes"] - dev["headroom_bytes"]
                    worst = max(worst, dev["committed_bytes"] + dev["foreign_bytes"] - usable)
                    if dev["foreign_bytes"] > hog_bytes * 0.9 and dev["available_bytes"] >= 0:
                        break
                    await asyncio.sleep(0.05)
                assert dev["foreign_bytes"] > hog_bytes * 0.9, dev
                foreign_mib = dev["foreign_bytes"] / MIB
                assert dev["available_bytes"] >= 0, dev  # no overcommit: nothing to OOM
                states = {n: _svc(st, n)["state"] for n in ("asr", "chat", "image")}
                assert states["asr"] == "loaded", states  # realtime, pinned: kept
                assert states["image"] != "loaded" or states["chat"] != "loaded", states
                audio = b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\x00" * 64
                form = {"model": "asr", "file": audio}
                import aiohttp

                data = aiohttp.FormData()
                for key, value in form.items():
                    if isinstance(value, bytes):
                        data.add_field(key, value, filename="a.wav", content_type="audio/wav")
                    else:
                        data.add_field(key, value)
                status, out, _ = await lv.post("/v1/audio/transcriptions", data=data)
                assert status == 200, out  # realtime still served while the hog holds memory
                evicted = [n for n, s in states.items() if s != "loaded"]
            finally:
                if hog.stdin is not None:
                    hog.stdin.close()
                hog.wait(timeout=30)
                if hog.stdout is not None:
                    hog.stdout.close()
                os.unlink(pid_dir / "hog.pid")
            for _ in range(100):
                dev = (await _status(lv))["devices"][0]
                if dev["foreign_bytes"] < hog_bytes * 0.1:
                    break
                await asyncio.sleep(0.05)
            assert dev["foreign_bytes"] < hog_bytes * 0.1, dev
            status, out, _ = await _chat(lv)
            assert status == 200, out  # after the hog left, the evicted chat comes back
            record(
                area="fault",
                case="a foreign process grabs 1.5 GiB of a 3 GiB device",
                expected="the budget shrinks, lower classes yield, no OOM",
                happened=f"a {hog_bytes / MIB:.0f} MiB hog measured as {foreign_mib:.0f} MiB "
                f"foreign; evicted {evicted}; the "
                "pinned realtime ASR stayed loaded and served; committed + foreign settled "
                "within budget - headroom; after the process ended, chat was served again",
                lost="nothing (evicted services reload on demand)",
                evicted=evicted,
            )

    run(body())


def test_request_uses_more_than_estimated(tmp_path: Path, record: Record) -> None:
    budget = 1024 * MIB
    cfg = base_config(
        embed={
            "kind": "embeddings",
            "concurrency": 8,
            "queue": {"limit": 64, "deadline_s": 60},
            "memory": {"weights": "96MiB", "per_unit": "1MiB"},
            "backend": fake(latency_s=0.05, request_bytes=300 * MIB, allocate=False),
        }
    )
    cfg["devices"]["gpu"].update({"capacity": budget, "headroom": 0})

    async def body() -> None:
        async with live(cfg, tmp=tmp_path) as lv:
            payload = {"model": "embed", "input": [f"t{i}" for i in range(100)]}
            first = _svc(await _status(lv), "embed")["calibration_factor"]
            for _ in range(10):  # calibration: each request really uses 3x its estimate
                assert (await lv.post("/v1/embeddings", json=payload))[0] == 200
            after = _svc(await _status(lv), "embed")["calibration_factor"]
            assert after >= 3.0, after
            backend = lv.runtime.backends["embed"]
            peak = 0
            done = False

            async def watch() -> None:
                nonlocal peak
                while not done:
                    peak = max(peak, backend.memory_bytes() or 0)
                    await asyncio.sleep(0.002)

            watcher = asyncio.create_task(watch())
            answers = await asyncio.gather(
                *(lv.post("/v1/embeddings", json=payload) for _ in range(8))
            )
            done = True
            await watcher
            assert all(a[0] == 200 for a in answers), [a[0] for a in answers]
            assert peak <= budget, (peak, budget)
            record(
                area="fault",
                case="requests use 3x their estimated memory",
                expected="calibration raises the estimate; the service stays under its ceiling",
                happened=f"calibration factor {first} -> {after}; a burst of 8 (concurrency 8) "
                f"then peaked at {peak / MIB:.0f} MiB of a {budget / MIB:.0f} MiB budget "
                "(without calibration 8 x 3 x 120 MiB would need 2.9 GiB)",
                calibration_factor=after,
                peak_mib=round(peak / MIB),
            )

    run(body())


SILENT_CHILD = """
import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(60)  # never answers /health; bounded: ends by itself
"""


def test_external_load_hangs_times_out_and_stops_the_child(tmp_path: Path, record: Record) -> None:
    pid_file = tmp_path / "child.pid"
    cfg = base_config(
        chat={
            "kind": "chat",
            "load_timeout_s": 1.0,
            "memory": {"weights": "256MiB"},
            "backend": {
                "type": "external",
                "argv": [sys.executable, "-c", SILENT_CHILD, str(pid_file)],
                "startup_timeout_s": 300,
                "stop_grace_s": 1,
            },
        }
    )

    async def body() -> None:
        from tests.reliability.support import pid_alive

        async with live(cfg, tmp=tmp_path / "data") as lv:
            started = time.monotonic()
            status, err, _ = await _chat(lv)
            waited = time.monotonic() - started
            assert status == 503 and err["error"]["code"] == "load_failed", err
            assert "timed out after 1s" in err["error"]["message"], err
            child = int(pid_file.read_text())
            for _ in range(100):
                if not pid_alive(child):
                    break
                await asyncio.sleep(0.05)
            assert not pid_alive(child), "the hung child must be stopped"
            chat = _svc(await _status(lv), "chat")
            assert sum(chat["ledger"].values()) == 0, chat
            record(
                area="fault",
                case="an external server never becomes healthy (startup_timeout_s 300 s)",
                expected="the runtime's load_timeout_s fires; the child is stopped",
                happened=f"503 load_failed 'load timed out after 1s' after {waited:.1f}s; the "
                "child process was stopped (TERM, then KILL); ledger rolled back",
            )

    run(body())
