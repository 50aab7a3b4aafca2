"""schemathesis over the daemon's own ``/openapi.json`` (a real ``accelmux serve``
process): every route, every check and phase, a fixed seed, a bounded number of
examples (:mod:`tests.reliability.conformance`). No failure of any check: the document
and the daemon agree on what is accepted, what each answer looks like, which methods a
route takes (405 with ``Allow`` otherwise), and nothing answers 5xx, hangs or crashes."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.reliability.conformance import EXCLUDED, MAX_EXAMPLES, SEED, daemon_config, run
from tests.reliability.conftest import Record
from tests.reliability.support import http, running, write_config

pytestmark = pytest.mark.slow


def test_schemathesis_finds_no_failure_on_any_route(tmp_path: Path, record: Record) -> None:
    path = write_config(daemon_config(), tmp_path)
    with running(path, log_name="conformance") as daemon:
        result = run(daemon.url)
        assert http("GET", daemon.url + "/health")[0] == 200
    log = daemon.log.read_text()
    assert "Traceback" not in log, log[-4000:]
    assert result.returncode == 0 and result.failures == 0, result.output[-12000:]
    assert result.documented >= 30, result.output[-3000:]
    assert result.operations == result.documented - 1, result.output[-3000:]  # all but EXCLUDED
    assert result.cases > 1000, result.output[-3000:]
    record(
        area="bad input",
        case=f"schemathesis over /openapi.json, every check and phase: {result.operations} "
        f"operations (all but {EXCLUDED}), up to {MAX_EXAMPLES} examples each, seed {SEED}",
        expected="no failure of any check; no hang, no crash",
        happened=f"{result.cases} requests, {result.failures} failures; the daemon stayed up "
        "and logged no traceback",
        requests=result.cases,
        operations=result.operations,
    )
