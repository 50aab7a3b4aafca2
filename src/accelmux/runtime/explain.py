"""Why a request waited or was refused, and why memory is full, in ledger terms.

Built from the Manager's snapshot (:meth:`Manager.snapshot`, as a dict) at the moment of a
decision: each service's bytes by category, foreign and headroom per device, and what the
policy would have had to evict to fit the request. The eviction answer is arithmetic on
the ledger (idle, unpinned, loaded services on the device, largest first), not the
policy's own choice: it says how much could have been freed, and by whom.

Every device's ``breakdown`` lists every category the ledger uses, and they add up to
the device's capacity to the byte (:func:`breakdown`): the services' categories
(weights, runtime, kv, active, reserved, leftover, each summed over the device's
services), the workers' ``overhead``, ``foreign``, ``parked``, ``headroom``,
``outside_budget`` (capacity less the budget) and ``available`` (what is left; negative
when the ledger holds more than the budget: it says by how much).
"""

from __future__ import annotations

from typing import Any

#: Categories a service holds in the ledger, as the snapshot names them.
LEDGER_CATEGORIES = ("weights", "runtime", "kv", "active", "reserved", "leftover")
#: Per-device categories, after the services' own, in the order a breakdown lists them.
DEVICE_CATEGORIES = ("overhead", "foreign", "parked", "headroom", "outside_budget", "available")


def breakdown(dev: dict[str, Any], services: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every ledger category of one device (``dev``: its snapshot view; ``services``: the
    snapshot's services on it) with its bytes; they add up to ``capacity_bytes``."""
    held = {cat: sum(int(s["ledger"].get(cat, 0)) for s in services) for cat in LEDGER_CATEGORIES}
    capacity, budget = int(dev["capacity_bytes"]), int(dev["budget_bytes"])
    rest = {
        "overhead": int(dev.get("overhead_bytes", 0)),
        "foreign": int(dev.get("foreign_bytes", 0)),
        "parked": int(dev.get("parked_bytes", 0)),
        "headroom": int(dev.get("headroom_bytes", 0)),
        "outside_budget": capacity - budget,
    }
    # what the ledger has left: the budget less everything it holds (as Ledger.available)
    rest["available"] = (
        budget
        - sum(held.values())
        - sum(rest[k] for k in ("overhead", "foreign", "parked", "headroom"))
    )
    return [{"category": c, "bytes": n} for c, n in (*held.items(), *rest.items())]


def ledger_picture(snap: dict[str, Any]) -> dict[str, Any]:
    """Per device: its totals and each service's bytes by category."""
    devices: dict[str, Any] = {}
    for dev in snap["devices"]:
        devices[dev["name"]] = {
            key: dev.get(f"{key}_bytes", 0)
            for key in (
                "capacity",
                "budget",
                "headroom",
                "foreign",
                "overhead",
                "parked",
                "committed",
                "available",
            )
        }
        on_device = [s for s in snap["services"] if s["device"] == dev["name"]]
        devices[dev["name"]]["breakdown"] = breakdown(dev, on_device)
        devices[dev["name"]]["services"] = {}
    for svc in snap["services"]:
        held = {cat: int(svc["ledger"].get(cat, 0)) for cat in LEDGER_CATEGORIES}
        devices[svc["device"]]["services"][svc["name"]] = {
            "state": svc["state"],
            "pinned": svc["pinned"],
            "inflight": svc["inflight"],
            "total": sum(held.values()),
            **held,
        }
    return devices


def evictable(device: dict[str, Any], *, exclude: str | None = None) -> list[tuple[str, int]]:
    """(service, bytes) of what could be unloaded now: loaded, idle, unpinned; largest
    first."""
    out = [
        (name, s["total"])
        for name, s in device["services"].items()
        if name != exclude
        and s["state"] == "loaded"
        and not s["pinned"]
        and s["inflight"] == 0
        and s["total"] > 0
    ]
    return sorted(out, key=lambda item: (-item[1], item[0]))


def eviction_needed(device: dict[str, Any], needed: int, *, exclude: str | None) -> dict[str, Any]:
    """What would have had to go for ``needed`` bytes to fit on ``device``."""
    shortfall = max(0, needed - int(device["available"]))
    chosen: list[dict[str, Any]] = []
    freed = 0
    for name, held in evictable(device, exclude=exclude):
        if freed >= shortfall:
            break
        chosen.append({"service": name, "bytes": held})
        freed += held
    return {
        "needed_bytes": needed,
        "available_bytes": int(device["available"]),
        "shortfall_bytes": shortfall,
        "would_evict": chosen,
        "freed_bytes": freed,
        "enough": freed >= shortfall,
    }


def why_full(snap: dict[str, Any]) -> dict[str, Any]:
    """The daemon's answer to "why is memory full": per device, who holds what."""
    picture = ledger_picture(snap)
    lines: list[str] = []
    for name, dev in picture.items():
        holders = sorted(dev["services"].items(), key=lambda kv: -kv[1]["total"])
        shown = ", ".join(
            f"{svc} {_mib(s['total'])} ({s['state']}"
            + (", pinned" if s["pinned"] else "")
            + (f", {s['inflight']} running" if s["inflight"] else "")
            + ")"
            for svc, s in holders
            if s["total"] > 0
        )
        lines.append(
            f"{name}: budget {_mib(dev['budget'])}, committed {_mib(dev['committed'])}, "
            f"available {_mib(dev['available'])}, foreign {_mib(dev['foreign'])}, "
            f"overhead {_mib(dev['overhead'])}, headroom {_mib(dev['headroom'])}; "
            f"held by: {shown or 'nobody'}"
        )
        parts = ", ".join(f"{b['category']} {_mib(b['bytes'])}" for b in dev["breakdown"])
        lines.append(f"{name}: capacity {_mib(dev['capacity'])} = {parts}")
        free_now = sum(b for _, b in evictable(dev))
        lines.append(f"{name}: {_mib(free_now)} could be freed now by unloading idle services")
    return {"lines": lines, "devices": picture}


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
