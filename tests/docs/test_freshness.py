"""Published figures come from runs of today's policy (bench/freshness.py has the rule).

A figure in README.md or docs/*.md rendered from a policy-dependent result whose recorded
decision digest differs from today's (tests/sim/policy_digest.json) is stale: this fails
on it unless bench/stale.yaml lists it with the reason it was not measured again.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import docgen  # noqa: E402
import freshness  # noqa: E402


def _shown() -> dict[str, list[str]]:
    """Each result file a generated block of the docs reads -> the blocks showing it."""
    blocks = docgen.renderers()
    shown: dict[str, list[str]] = {}
    for doc in docgen.docs():
        for m in docgen._BLOCK.finditer(doc.read_text(encoding="utf-8")):
            name = m.group("name")
            if name not in blocks:
                continue
            for path in docgen.sources(blocks[name])[1]:
                shown.setdefault(path.name, []).append(f"{doc.name}:{name}")
    return shown


def test_every_result_is_classified_once() -> None:
    on_disk = {p.name for p in freshness.RESULTS.glob("*.json")}
    dependent, independent = set(freshness.DEPENDENT), set(freshness.INDEPENDENT)
    assert not dependent & independent
    assert on_disk - dependent - independent == set(), (
        "say in bench/freshness.py whether these results depend on the policy's decisions"
    )
    assert dependent | independent <= on_disk, "bench/freshness.py names results that are gone"


def test_no_published_figure_comes_from_an_older_policy() -> None:
    listed = freshness.listed_stale()
    now = freshness.today()
    stale = []
    for name, where in sorted(_shown().items()):
        state = freshness.staleness(name, now)
        if state is not None and state.stale and name not in listed:
            stale.append(f"{name} (shown in {', '.join(where)}): recorded {state.recorded}")
    assert not stale, (
        "figures measured under another policy than today's; run their benchmarks again "
        "(or list them in bench/stale.yaml with the reason they cannot be):\n" + "\n".join(stale)
    )


def test_the_stale_list_holds_only_stale_results() -> None:
    now = freshness.today()
    for name in freshness.listed_stale():
        state = freshness.staleness(name, now)
        assert state is not None, f"bench/stale.yaml: {name} does not depend on the policy"
        assert state.stale, f"bench/stale.yaml: {name} is measured under today's policy: drop it"


def test_a_stale_result_is_marked_where_it_is_shown() -> None:
    now = freshness.today()
    old = freshness.Staleness("x.json", freshness.ACCELMUX, {"accelmux": "0" * 64}, now)
    fresh = freshness.Staleness("x.json", freshness.ALL, dict(now), now)
    unknown = freshness.Staleness("x.json", freshness.ACCELMUX, None, now)
    assert old.stale and unknown.stale and not fresh.stale
    # a baseline's change leaves a real-stack figure (accelmux only) fresh
    other = {**now, "baselines": "1" * 64}
    assert not freshness.Staleness("x.json", freshness.ACCELMUX, other, now).stale
    assert freshness.Staleness("x.json", freshness.ALL, other, now).stale
    assert "**Stale**" in old.note("why") and "why" in old.note("why")


def test_a_block_lists_the_results_it_reads() -> None:
    text, read = docgen.sources(lambda: (docgen.RESULTS / "gateway.json").read_text("utf-8")[:1])
    assert text == "{" and [p.name for p in read] == ["gateway.json"]
