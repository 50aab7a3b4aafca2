"""Background work yields compute to interactive work, as batch work does.

A background request (an indexing document) that is not a steady stream does not start
while an interactive request runs on its device: it would slow the stream beside it, and
on a host device every model shares the cores. Before, only batch work yielded, and an
indexing job of two documents at a time beside a chat model on a host stretched each
chat stream's tokens past their objective (generated ``home-0176``: interactive 37.5 %
where ``llama-swap`` gave 75 %). A steady service (a camera's frames) runs on: a frame
cannot wait for a chat stream to end.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from accelmux.core.manager import Manager
from accelmux.core.types import GIB, Reason, ServiceClass

from .support import EXACT, arrive, device, dispatched, done, enqueued, manager, service, up


def _home() -> Manager:
    chat = service("chat", concurrency=2)
    embed = service("embed", cls=ServiceClass.BACKGROUND, concurrency=2)
    camera = dataclasses.replace(
        service("camera", cls=ServiceClass.BACKGROUND, concurrency=2), steady=True
    )
    return manager(chat, embed, camera, devices=(device(budget=16 * GIB),), knobs=EXACT)


def test_an_indexing_document_waits_while_a_chat_request_runs() -> None:
    m = _home()
    up(m, "chat", "embed", "camera")
    assert dispatched(m.handle(arrive("c1", "chat"), 1.0)) == ["c1"]
    acts = m.handle(arrive("e1", "embed"), 1.5)
    wait = enqueued(acts)["e1"]
    assert wait.reason is Reason.HIGHER_CLASS_WAITING
    assert "interactive work running" in wait.detail
    # a camera's frame runs on beside the chat request
    assert dispatched(m.handle(arrive("f1", "camera"), 1.6)) == ["f1"]
    assert dispatched(m.handle(done("c1"), 2.0)) == ["e1"]


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["chat", "embed", "camera", "done"]), st.integers(0, 7)),
        min_size=1,
        max_size=30,
    )
)
def test_no_indexing_document_starts_beside_a_running_chat_request(
    steps: list[tuple[str, int]],
) -> None:
    """Whatever arrives and ends, in any order: an embedding request is never dispatched
    while a chat request is in flight, and none waits once no chat request runs and its
    service has a free slot."""
    m = _home()
    up(m, "chat", "embed", "camera")
    running: dict[str, str] = {}
    now = 1.0
    for i, (what, pick) in enumerate(steps):
        now += 0.1
        if what == "done":
            if not running:
                continue
            rid = sorted(running)[pick % len(running)]
            acts = m.handle(done(rid), now)
            running.pop(rid)
        else:
            acts = m.handle(arrive(f"{what}-{i}", what), now)
        for rid in dispatched(acts):
            running[rid] = rid.split("-")[0]
            if running[rid] == "embed":
                assert "chat" not in running.values()
    world = m.world
    if "chat" not in running.values() and len(world.services["embed"].inflight) < 2:
        assert not any(r.service == "embed" for r in world.waiting.values())
