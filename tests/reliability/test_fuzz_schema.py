"""Fuzz every operation of the daemon's own OpenAPI document (``/openapi.json``) with
schemathesis: whatever comes in, no 5xx, no hang, no crash. A real ``accelmux serve``
process answers; the examples per operation are bounded so the run takes about a minute.

``/admin/events`` is left out: it is an endless SSE stream by design (a client reads it
until it goes away), so "no hang" cannot hold for it; tests/live covers it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from tests.live.support import base_config
from tests.reliability.conftest import Record
from tests.reliability.support import Proc, http, start, write_config

from accelmux.gateway.openapi import document

SCHEMA = schemathesis.openapi.from_dict(document()).exclude(path="/admin/events")
MAX_EXAMPLES = 250
TIMEOUT_S = 15.0
SEEN: dict[str, dict[int, int]] = {}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    tmp = tmp_path_factory.mktemp("fuzz")
    cfg = base_config()
    cfg["server"].update({"max_body": "2MiB"})
    proc = start(write_config(cfg, tmp), log_name="fuzz")
    try:
        yield proc
    finally:
        assert proc.alive(), "the daemon died during fuzzing: " + proc.log.read_text()[-4000:]
        proc.stop()
        log = proc.log.read_text()
        assert "Traceback" not in log, log[-4000:]


@SCHEMA.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_fuzz_operation(case: Any, daemon: Proc) -> None:
    response = case.call(base_url=daemon.url, timeout=TIMEOUT_S)
    label = case.operation.label
    codes = SEEN.setdefault(label, {})
    codes[response.status_code] = codes.get(response.status_code, 0) + 1
    case.validate_response(response, checks=[not_a_server_error])


def test_fuzz_summary(daemon: Proc, record: Record) -> None:
    """Runs after the fuzz cases (same module): the daemon still answers; one row."""
    status, _, _ = http("GET", daemon.url + "/health")
    assert status == 200
    total = sum(sum(c.values()) for c in SEEN.values())
    codes: dict[int, int] = {}
    for per_op in SEEN.values():
        for code, n in per_op.items():
            codes[code] = codes.get(code, 0) + n
    assert not any(code >= 500 for code in codes), codes
    documented = {f"{m.upper()} {p}" for p, ops in document()["paths"].items() for m in ops}
    record(
        area="bad input",
        case=f"schemathesis over /openapi.json: {len(SEEN)} of {len(documented)} documented "
        f"operations, up to {MAX_EXAMPLES} generated requests each",
        expected="no 5xx, no hang, no crash",
        happened=f"{total} requests; answers {dict(sorted(codes.items()))}; the daemon "
        "stayed up and logged no traceback",
        requests=total,
        operations=len(SEEN),
    )
