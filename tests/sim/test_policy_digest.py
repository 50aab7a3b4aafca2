"""The committed policy digest is the digest of this checkout's decisions.

Benchmarks record it (bench/meta.py) and the docs test compares their records with the
committed one (tests/docs/test_freshness.py); this keeps the committed one true.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import policy_digest


def test_the_committed_policy_digest_is_todays() -> None:
    committed = policy_digest.committed()
    assert {k: committed[k] for k in ("accelmux", "baselines")} == policy_digest.compute(), (
        "the policy decides differently from the committed digest: if that is meant, "
        "regenerate: PYTHONPATH=src:bench python bench/decision_stream.py --golden "
        "(and run scripts/gate)"
    )
    assert committed["scope"] == policy_digest.SCOPE
