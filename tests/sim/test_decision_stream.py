"""Every policy decides on a short scenario exactly as it did when the digests were made.

The stream of a run (``bench/decision_stream.py``: every event, action and wake-up the
Manager saw and gave, field by field) is hashed. A change that is meant to leave the
decisions as they were (a faster index, a cache) must leave every digest as it is; one
that changes decisions on purpose regenerates them, and says so in its commit:

    PYTHONPATH=src:bench python bench/decision_stream.py --golden

To see where two versions part, write both streams and diff them (see that script).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import decision_stream

GOLDEN = json.loads(decision_stream.GOLDEN.read_text(encoding="utf-8"))


def test_every_policy_has_a_golden_digest() -> None:
    assert sorted(GOLDEN) == sorted(decision_stream.POLICIES)


@pytest.mark.parametrize("policy", decision_stream.POLICIES)
def test_the_decision_stream_matches_its_golden_digest(policy: str) -> None:
    lines = decision_stream.simulation_stream(
        decision_stream.GOLDEN_SCENARIO, policy, 0, decision_stream.GOLDEN_DURATION_S
    )
    assert len(lines) > 1000  # the run decides something
    assert decision_stream.digest(lines) == GOLDEN[policy], (
        f"{policy} decides differently on {decision_stream.GOLDEN_SCENARIO.name}: if that is "
        "meant, regenerate: PYTHONPATH=src:bench python bench/decision_stream.py --golden"
    )
