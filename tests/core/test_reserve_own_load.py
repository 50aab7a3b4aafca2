"""A batch load that fits free memory only within the realtime reserve may hold it.

The reserve keeps the next activations of the loaded voice models free. Services that
realtime work takes back by one unload may hold it (``reserve_lending``), but a load
never counted itself among them: a batch model that fit in free memory only within the
reserve waited for as long as the voice models stayed loaded, while the memory sat free
(found by bench/adversary.py, ``adv-0115``: batch 0 % where llama-swap gave 79 %, voice
100 % under both). Now the load of a service whose work realtime stops, and which it
then evicts, holds the reserve; a voice request that arrives stops the batch request
and evicts the model, and waits for that one unload. Interactive loads still leave the
reserve free.
"""

from __future__ import annotations

from accelmux.core.events import Unloaded
from accelmux.core.manager import Manager
from accelmux.core.types import GIB, MIB, Reason, Residency, ServiceClass, ServiceKind

from .support import (
    EXACT,
    arrive,
    device,
    dispatched,
    enqueued,
    loaded,
    loads,
    manager,
    plain_profile,
    service,
    unloads,
    up,
)


def _home() -> Manager:
    asr = service(
        "asr",
        cls=ServiceClass.REALTIME,
        kind=ServiceKind.ASR,
        residency=Residency.PINNED,
        profile=plain_profile(weights=GIB, workspace=512 * MIB),
        deadline_s=10.0,
    )
    agent = service(
        "agent",
        cls=ServiceClass.BATCH,
        kind=ServiceKind.EMBEDDINGS,
        profile=plain_profile(weights=2 * GIB + 768 * MIB, workspace=0),
        deadline_s=900.0,
    )
    chat = service("chat", profile=plain_profile(weights=2 * GIB + 768 * MIB, workspace=0))
    # 4 GiB: asr 1 GiB, 3 GiB free, 512 MiB of them the reserve for its next request
    return manager(asr, agent, chat, devices=(device(budget=4 * GIB, headroom=0),), knobs=EXACT)


def test_a_batch_load_that_fits_only_within_the_reserve_holds_it() -> None:
    m = _home()
    up(m, "asr")
    acts = m.handle(arrive("b1", "agent"), 1.0)
    assert [ld.service for ld in loads(acts)] == ["agent"]
    assert dispatched(m.handle(loaded("agent"), 2.0)) == ["b1"]
    # a voice request stops the batch request, evicts the model and runs after the unload
    acts = m.handle(arrive("v1", "asr"), 3.0)
    assert [u.service for u in unloads(acts)] == ["agent"]
    assert dispatched(m.handle(Unloaded(service="agent"), 3.5)) == ["v1"]


def test_an_interactive_load_still_leaves_the_reserve_free() -> None:
    m = _home()
    up(m, "asr")
    acts = m.handle(arrive("c1", "chat"), 1.0)
    assert not loads(acts)
    assert enqueued(acts)["c1"].reason is Reason.NO_MEMORY
