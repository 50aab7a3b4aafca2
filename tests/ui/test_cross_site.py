"""A page of another site, in a real browser (headless Chromium), tries to drive the daemon
(``accelmux serve`` on loopback, default settings): a form POST that unpins and unloads a
voice service, a ``text/plain`` JSON fetch that would run inference, a ``no-cors`` fetch,
and DNS rebinding (``--host-resolver-rules`` maps evil.example to 127.0.0.1, so a page at
http://evil.example:PORT/ is same-origin with the daemon, as after a real rebinding).
Nothing changes and nothing is read; the daemon's own dashboard keeps working."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http import server as http_server
from pathlib import Path
from typing import Any

import pytest
from tests.live.support import base_config, fake
from tests.reliability.support import Proc, http, running, service, write_config
from tests.ui.support import chromium, need_browser, script_errors, wait_until

EVIL = "evil.example"
ATTACK_JS = """
const done = arguments[arguments.length - 1];
const daemon = arguments[0];
const chat = JSON.stringify({model: "chat", messages: [{role: "user", content: "hi"}]});
(async () => {
  const out = {};
  async function attempt(name, url, init) {
    try {
      const resp = await fetch(url, init);
      const text = resp.type === "opaque" ? "" : await resp.text();
      out[name] = {type: resp.type, status: resp.status, text: text};
    } catch (e) {
      out[name] = {error: String(e)};
    }
  }
  await attempt("plain", daemon + "/v1/chat/completions",
    {method: "POST", headers: {"Content-Type": "text/plain"}, body: chat});
  await attempt("nocors", daemon + "/v1/chat/completions",
    {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body: chat});
  await attempt("nocors_unpin", daemon + "/admin/services/asr/unpin",
    {method: "POST", mode: "no-cors"});
  await attempt("json", daemon + "/v1/chat/completions",
    {method: "POST", headers: {"Content-Type": "application/json"}, body: chat});
  await attempt("status", daemon + "/admin/status", {});
  done(out);
})();
"""


def _config() -> dict[str, Any]:
    return base_config(
        chat={
            "kind": "chat",
            "residency": "on-demand",
            "memory": {"weights": "64MiB"},
            "backend": fake(),
        },
        asr={
            "kind": "asr",
            "class": "realtime",
            "residency": "pinned",
            "memory": {"weights": "64MiB"},
            "backend": fake(),
        },
    )


@dataclass
class Stage:
    daemon: Proc
    port: int
    attacker: str
    browser: Any

    def state(self, name: str) -> Any:
        return service(http("GET", self.daemon.url + "/admin/status")[1], name)


class _Quiet(http_server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _attacker(pages: Path) -> Iterator[int]:
    """Another site: plain files served from ``pages`` on its own loopback port."""
    handler = functools.partial(_Quiet, directory=str(pages))
    server = http_server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _pages(pages: Path, daemon: str) -> None:
    pages.mkdir()
    (pages / "blank.html").write_text("<!doctype html><title>elsewhere</title><p>hello</p>")
    for op in ("unpin", "unload"):
        (pages / f"form-{op}.html").write_text(
            "<!doctype html><title>win a prize</title>"
            f'<form id="f" method="POST" action="{daemon}/admin/services/asr/{op}">'
            '<input name="x" value="1"></form>'
            "<script>document.getElementById('f').submit();</script>"
        )


@pytest.fixture(scope="module")
def stage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stage]:
    need_browser()
    tmp = tmp_path_factory.mktemp("cross-site")
    with running(write_config(_config(), tmp)) as daemon:
        port = int(daemon.url.rsplit(":", 1)[1])
        _pages(tmp / "pages", daemon.url)
        rules = f"--host-resolver-rules=MAP {EVIL} 127.0.0.1"
        with _attacker(tmp / "pages") as other, chromium(flags=(rules,)) as browser:
            yield Stage(daemon, port, f"http://{EVIL}:{other}", browser)


def _untouched(stage: Stage) -> None:
    asr = stage.state("asr")
    assert asr["state"] == "loaded" and asr["pinned"], asr
    assert stage.state("chat")["state"] == "unloaded", "an inference request ran"


def test_form_post_from_another_site_changes_nothing(stage: Stage) -> None:
    for op in ("unpin", "unload"):
        stage.browser.get(f"{stage.attacker}/form-{op}.html")
        wait_until(
            lambda op=op: stage.browser.current_url.endswith(f"/admin/services/asr/{op}"),
            what=f"the form posted to {op}",
        )
        text = stage.browser.find_element("tag name", "body").text
        assert "origin_not_allowed" in text and "server.cors_origins" in text, text
    _untouched(stage)


def test_fetches_from_another_site_run_nothing_and_read_nothing(stage: Stage) -> None:
    stage.browser.get(f"{stage.attacker}/blank.html")
    out = stage.browser.execute_async_script(ATTACK_JS, stage.daemon.url)
    for name in ("plain", "json", "status"):  # no CORS for this origin: nothing readable
        assert "error" in out[name], (name, out[name])
    assert out["nocors"]["type"] == "opaque" and out["nocors_unpin"]["type"] == "opaque", out
    _untouched(stage)


def test_dns_rebinding_is_refused(stage: Stage) -> None:
    rebound = f"http://{EVIL}:{stage.port}"
    stage.browser.get(rebound + "/health")  # a page of evil.example, now on 127.0.0.1
    out = stage.browser.execute_async_script(ATTACK_JS, rebound)
    for name in ("plain", "json", "status"):  # same origin: the answers are readable
        assert out[name]["status"] == 403, (name, out[name])
        assert "host_not_allowed" in out[name]["text"], out[name]
        assert "server.allowed_hosts" in out[name]["text"], out[name]
    assert '"services"' not in out["status"]["text"]
    _untouched(stage)


def test_dashboard_on_its_own_origin_still_works(stage: Stage) -> None:
    script_errors(stage.browser)  # forget the attacker pages' (blocked fetches)
    for origin in (stage.daemon.url, f"http://localhost:{stage.port}"):
        stage.browser.get(origin + "/")
        wait_until(
            lambda: (
                stage.browser.execute_script(
                    "return document.querySelectorAll('#services tr[data-service]').length;"
                )
                == 2
            ),
            what="the services table",
        )
    # the dashboard's own request code (what its buttons call): a POST with no body
    call = (
        "const done = arguments[arguments.length - 1];"
        "api('/admin/services/asr/unpin', {method: 'POST'})"
        ".then(() => done('ok'), (e) => done('failed: ' + e.message));"
    )
    assert stage.browser.execute_async_script(call) == "ok"
    assert not stage.state("asr")["pinned"]
    assert not script_errors(stage.browser)
