"""Ablation switches: every accelmux heuristic can be turned off by name."""

from __future__ import annotations

from dataclasses import replace

import pytest

from accelmux.config.load import load_config_text
from accelmux.config.specs import to_manager_spec
from accelmux.core.actions import Dispatch, Preempt, Resize
from accelmux.core.events import Tick
from accelmux.core.policies.accelmux import HEURISTICS
from accelmux.core.policies.accelmux.heuristics import TUNING
from accelmux.core.types import GIB, Reason, ServiceClass, ServiceKind
from accelmux.errors import ConfigError

from .support import (
    EXACT,
    arrive,
    device,
    done,
    llm_profile,
    manager,
    of,
    plain_profile,
    resized,
    service,
    up,
)

CONFIG = """
devices:
  gpu: {{kind: virtual, capacity: 12GiB, budget: 12GiB, headroom: 512MiB}}
services: {{}}
policy:
  disable: {disable}
"""


def test_every_heuristic_has_a_one_line_description() -> None:
    assert HEURISTICS
    for name, text in HEURISTICS.items():
        assert name.isidentifier() and name == name.lower()
        assert text and "\n" not in text


def test_disable_reaches_the_world_knobs() -> None:
    cfg = load_config_text(CONFIG.format(disable="[preemption, ballooning]"))
    spec = to_manager_spec(cfg)
    assert spec.knobs.disabled == frozenset({"preemption", "ballooning"})
    assert not spec.knobs.switches.preemption
    assert spec.knobs.switches.calibration


def test_an_unknown_heuristic_is_an_error_that_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as err:
        load_config_text(CONFIG.format(disable="[preemption, teleport]"))
    text = str(err.value)
    assert "teleport" in text
    for name in HEURISTICS:
        assert name in text


def test_realtime_grace_is_its_knob_not_a_switch() -> None:
    # The grace after a realtime request is turned off by realtime_grace_s: 0; a switch
    # of the same meaning was removed.
    with pytest.raises(ConfigError, match="realtime_grace"):
        load_config_text(CONFIG.format(disable="[realtime_grace]"))


def _held_after_realtime(kind: str, grace_s: float | None, gap_s: float) -> bool:
    """Whether a batch request arriving ``gap_s`` after a realtime request ended on a
    device of ``kind`` waits (held) instead of being dispatched."""
    m = manager(
        service("asr", cls=ServiceClass.REALTIME, profile=plain_profile(weights=GIB)),
        service("emb", cls=ServiceClass.BATCH, profile=plain_profile(weights=GIB)),
        devices=(replace(device(), kind=kind),),
        knobs=replace(EXACT, realtime_grace_s=grace_s),
    )
    up(m, "emb", "asr")  # the batch model first: asr's warm-up holds it for the grace
    m.handle(arrive("a1", "asr"), 1.0)
    m.handle(done("a1"), 1.5)
    out = m.handle(arrive("e1", "emb"), 1.5 + gap_s)
    return not of(Dispatch, out)


@pytest.mark.parametrize("kind", ["virtual", "host"])
@pytest.mark.parametrize(("grace_s", "held"), [(0.25, True), (0.0, False)])
def test_realtime_grace_s_holds_batch_work_after_a_realtime_request(
    kind: str, grace_s: float, held: bool
) -> None:
    # a value set applies on every device, discrete or shared
    assert _held_after_realtime(kind, grace_s, 0.1) is held


@pytest.mark.parametrize(("kind", "held"), [("host", True), ("virtual", False)])
def test_unset_realtime_grace_holds_only_where_compute_is_shared(kind: str, held: bool) -> None:
    # unset: the policy's own grace on a host (its cores are every model's), none on a
    # discrete accelerator; after it, the held work starts
    assert _held_after_realtime(kind, None, 0.1) is held
    assert _held_after_realtime(kind, None, TUNING.host_realtime_grace_s + 0.01) is False


def _preemption_case(*disabled: str) -> list[Dispatch | Preempt]:
    big = plain_profile(weights=GIB, workspace=5 * GIB)
    m = manager(
        service("emb", cls=ServiceClass.BATCH, profile=big, kind=ServiceKind.EMBEDDINGS),
        service("ia", cls=ServiceClass.INTERACTIVE, profile=big),
        knobs=replace(EXACT, disabled=frozenset(disabled)),
    )
    up(m, "emb", "ia")
    m.handle(arrive("e1", "emb"), 1.0)
    out = m.handle(arrive("i1", "ia"), 2.0)
    return [a for a in out if isinstance(a, Dispatch | Preempt)]


def test_without_preemption_a_higher_class_waits_instead() -> None:
    assert [type(a) for a in _preemption_case()] == [Preempt, Dispatch]
    assert _preemption_case("preemption") == []


def test_without_ballooning_an_idle_pool_keeps_its_size() -> None:
    def shrinks(*disabled: str) -> list[Resize]:
        m = manager(
            service("chat", kind=ServiceKind.CHAT, profile=llm_profile()),
            knobs=replace(EXACT, disabled=frozenset(disabled)),
        )
        up(m, "chat")
        (grow,) = of(Resize, m.handle(arrive("c1", "chat", kv_tokens=8000), 1.0))
        m.handle(resized("chat", grow.kv_pool_bytes), 1.0)
        m.handle(done("c1"), 2.0)
        out = m.handle(Tick(), 100.0)
        return [a for a in of(Resize, out) if a.reason is Reason.BALLOON_SHRINK]

    assert shrinks() != []
    assert shrinks("ballooning") == []


def test_without_calibration_a_large_peak_does_not_raise_the_next_lease() -> None:
    def second_lease(*disabled: str) -> int:
        m = manager(
            service("img", profile=plain_profile(workspace=GIB)),
            knobs=replace(EXACT, disabled=frozenset(disabled)),
        )
        up(m, "img")
        m.handle(arrive("a", "img"), 1.0)
        m.handle(done("a", peak=2 * GIB), 2.0)
        (d,) = of(Dispatch, m.handle(arrive("b", "img"), 3.0))
        return d.lease_bytes

    assert second_lease() > 2 * GIB
    assert second_lease("calibration") == GIB
