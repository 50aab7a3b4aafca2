"""Beside interactive work, a background service keeps one request running, no more.

A background request (an indexing document) that is not a steady stream does not start
while an interactive request runs on its device and its own service already runs one:
each one beside a stream slows its tokens, and on a host device every model shares the
cores. Before, background work ran at its full concurrency beside chat, and an indexing
job of two documents at a time beside a chat model on a host stretched each chat
stream's tokens past their objective (generated ``home-0176``: interactive 37.5 % where
``llama-swap`` gave 75 %). Holding every document back instead (as batch work is held)
starved indexing where interactive work never stopped (``home-0044`` s0: background
79.1 -> 36.9 %). A steady service (a camera's frames) runs on: a frame cannot wait for
a chat stream to end.
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


def test_one_indexing_document_runs_beside_a_chat_request_the_next_waits() -> None:
    m = _home()
    up(m, "chat", "embed", "camera")
    assert dispatched(m.handle(arrive("c1", "chat"), 1.0)) == ["c1"]
    assert dispatched(m.handle(arrive("e1", "embed"), 1.5)) == ["e1"]
    wait = enqueued(m.handle(arrive("e2", "embed"), 1.6))["e2"]
    assert wait.reason is Reason.HIGHER_CLASS_WAITING
    assert "interactive work running" in wait.detail
    # a camera's frames run on beside the chat request, at their concurrency
    assert dispatched(m.handle(arrive("f1", "camera"), 1.7)) == ["f1"]
    assert dispatched(m.handle(arrive("f2", "camera"), 1.8)) == ["f2"]
    # the next document goes when the first ends, or when the chat request does
    assert dispatched(m.handle(done("e1"), 2.0)) == ["e2"]
    assert dispatched(m.handle(arrive("e3", "embed"), 2.1)) == []
    assert dispatched(m.handle(done("c1"), 2.5)) == ["e3"]


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["chat", "embed", "camera", "done"]), st.integers(0, 7)),
        min_size=1,
        max_size=30,
    )
)
def test_indexing_never_runs_two_documents_beside_a_chat_request(
    steps: list[tuple[str, int]],
) -> None:
    """Whatever arrives and ends, in any order: an embedding request is never dispatched
    while a chat request and another embedding request are in flight; none ever waits
    while its service has a free slot and no chat request runs."""
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
        before = dict(running)
        for rid in dispatched(acts):
            running[rid] = rid.split("-")[0]
            if running[rid] == "embed" and "chat" in before.values():
                assert "embed" not in before.values()
            before = dict(running)
    if "chat" not in running.values() and len(m.world.services["embed"].inflight) < 2:
        assert not any(r.service == "embed" for r in m.world.waiting.values())
