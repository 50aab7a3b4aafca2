"""Only the World's operations change it (an AST check of the policies and the Manager).

The operations of :class:`~accelmux.core.world.WorldOps` (``dispatch``, ``load``,
``mark_announced``, ``observe_failure``, ``crashed``, ``reconcile``...) keep the ledger,
the states and the indexes consistent and record every action; a policy or the Manager
that wrote a field itself (``req.announced = True``) or changed a collection the World
owns (``world.admin_unload.discard(name)``, ``svc.calibration.observe_excess(...)``)
would step around them. In a policy module (core's and the simulator's baselines) and in
``core/manager.py`` this test therefore fails on:

* an assignment, augmented assignment or ``del`` of an attribute named like a field of
  the World, a service state, a request state, the ledger or a calibration (unless it
  is the policy's own: ``self.x``), or of an item of one of them;
* a method call on such an attribute (``world.ledger.reserve(...)``), or on a local name
  bound to one (``ledger = world.ledger``), unless the method only reads;
* in a policy, a call of one of the operations the Manager alone uses (``set_status``,
  ``drain``, ``crashed``...).
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import accelmux.core.policies
import accelmux.sim.baselines
from accelmux.core.ledger import Ledger
from accelmux.core.profiles import RatioCalibrator, ServiceCalibration
from accelmux.core.specs import ManagerSpec
from accelmux.core.world import RequestState, ServiceSet, ServiceState, World
from accelmux.core.world.data import RequestPhase

from .support import device, service

POLICIES = Path(accelmux.core.policies.__file__).parent
BASELINES = Path(accelmux.sim.baselines.__file__).parent
CORE = POLICIES.parent


def _owned_names() -> frozenset[str]:
    world = World(ManagerSpec(devices=(device(),), services=(service("a"),)))
    names = {f.name for f in dataclasses.fields(ServiceState)}
    names |= {f.name for f in dataclasses.fields(RequestState)}
    names |= set(vars(world)) | set(vars(world.ledger))
    for cls in (ServiceCalibration, RatioCalibrator, ServiceSet):
        names |= set(cls.__slots__)
    assert isinstance(world.ledger, Ledger)
    return frozenset(names)


OWNED = _owned_names()
#: Methods that only read, callable on what the World owns.
READ_METHODS = frozenset(
    {
        # dict, set, list, deque
        "get",
        "keys",
        "values",
        "items",
        "copy",
        "count",
        "index",
        "issubset",
        "issuperset",
        "isdisjoint",
        "union",
        "intersection",
        "difference",
        # ServiceSet
        "names",
        # Ledger
        "amount",
        "available",
        "committed",
        "decided",
        "device_names",
        "fits",
        "foreign",
        "lease_count",
        "leases",
        "overhead",
        "parked",
        "service_breakdown",
        "service_total",
        "spec",
        # calibrations
        "project",
        "project_active",
        "project_observed",
        "project_resident",
        # the frozen specs and knobs
        "in_window",
        "seconds_until_edge",
        "as_dict",
    }
)
#: What a part calls the world it reads and the writer it holds (``self.view``...).
WORLD_HANDLES = frozenset({"view", "ops", "world"})
#: World methods only the Manager calls (its bookkeeping of events).
MANAGER_ONLY = frozenset(
    {
        "add_waiting",
        "advance",
        "arrive",
        "back_off",
        "crashed",
        "drain",
        "expired_requests",
        "load_done",
        "load_failed",
        "reconcile",
        "request_done",
        "shut_down",
        "take_changes",
        "unloaded",
        "finish",
        "next_seq",
        "record",
        "release_service",
        "request_admin_unload",
        "resize_done",
        "set_kept",
        "set_status",
    }
)


def _root(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _own_state(node: ast.expr) -> bool:
    """``node`` is reached from ``self`` other than through the world a part holds
    (``self.view``, ``self.ops``): the policy's (or part's) own state."""
    first: ast.expr | None = None
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        first = node
        node = node.func if isinstance(node, ast.Call) else node.value
    if not (isinstance(node, ast.Name) and node.id == "self"):
        return False
    return not (isinstance(first, ast.Attribute) and first.attr in WORLD_HANDLES)


def _owned(node: ast.expr, aliases: set[str]) -> bool:
    """``node`` is something the World owns: ``x.<owned name>``, or a local alias of one."""
    if isinstance(node, ast.Name):
        return node.id in aliases
    return isinstance(node, ast.Attribute) and node.attr in OWNED and not _own_state(node)


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        found = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        found = [node.target]
    elif isinstance(node, ast.Delete):
        found = list(node.targets)
    else:
        return []
    out: list[ast.expr] = []
    while found:
        t = found.pop()
        if isinstance(t, (ast.Tuple, ast.List)):
            found.extend(t.elts)
        elif isinstance(t, ast.Starred):
            found.append(t.value)
        else:
            out.append(t)
    return out


def _function_problems(func: ast.AST, policy: bool) -> list[tuple[int, str]]:
    aliases: set[str] = set()
    problems: list[tuple[int, str]] = []
    nodes = sorted(
        (n for n in ast.walk(func) if hasattr(n, "lineno")),
        key=lambda n: (n.lineno, n.col_offset),
    )
    for node in nodes:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and _owned(node.value, aliases)
        ):
            aliases.add(node.targets[0].id)
            continue
        for t in _targets(node):
            if isinstance(t, ast.Subscript):  # an item of something the World owns
                hit = _owned(t.value, aliases)
            else:  # a field the World owns, or any attribute of something it owns
                hit = isinstance(t, ast.Attribute) and (
                    _owned(t, aliases) or _owned(t.value, aliases)
                )
            if hit:
                problems.append((node.lineno, f"writes {ast.unparse(t)}"))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method, receiver = node.func.attr, node.func.value
            if _owned(receiver, aliases) and method not in READ_METHODS:
                problems.append((node.lineno, f"calls {ast.unparse(node.func)}"))
            elif policy and method in MANAGER_ONLY and _root(receiver) != "self":
                problems.append((node.lineno, f"calls {ast.unparse(node.func)} (the Manager's)"))
    return problems


def violations(source: str, policy: bool = True) -> list[str]:
    problems: set[tuple[int, str]] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            problems.update(_function_problems(node, policy))
    return [f"line {line}: {what}" for line, what in sorted(problems)]


def test_policies_change_the_world_only_through_its_operations() -> None:
    paths = [*sorted(POLICIES.rglob("*.py")), BASELINES / "policies.py"]
    found = {str(path): v for path in paths if (v := violations(path.read_text(encoding="utf-8")))}
    assert found == {}, "use (or add) a WorldOps operation instead"


def test_the_manager_writes_no_field_itself() -> None:
    """The Manager's bookkeeping of events is named operations too (``request_done``,
    ``load_done``, ``crashed``, ``reconcile``...): it writes nothing of the World."""
    found = violations((CORE / "manager.py").read_text(encoding="utf-8"), policy=False)
    assert found == [], "use (or add) a WorldOps operation instead"


def test_the_checker_catches_direct_writes() -> None:
    source = """\
def decide(self, world, now):
    req.announced = True
    svc.loads += 1
    world.admin_unload.discard(name)
    svc.calibration.observe_excess(1, 2)
    ledger = world.ledger
    ledger.reserve("gpu", "a", cat, 1)
    svc.queue[rid] = req
    del world.waiting[rid]
    world.services["a"].pinned, x = True, 1
    ops.set_status(svc, status)
    world.ledger.available("gpu")
    ops.dispatch(req, reason=r)
    ops.mark_announced(req)
    self._charged[name] = 1
    self.settings = None
    times.append(now)
    rnd.quiet = set()
    sorted(world.admin_unload)
    self.view.waiting[rid] = req
    self.view.services["a"].pinned = True
    self.yielded_to[rid] = other
"""
    assert violations(source) == [
        "line 2: writes req.announced",
        "line 3: writes svc.loads",
        "line 4: calls world.admin_unload.discard",
        "line 5: calls svc.calibration.observe_excess",
        "line 7: calls ledger.reserve",
        "line 8: writes svc.queue[rid]",
        "line 9: writes world.waiting[rid]",
        "line 10: writes world.services['a'].pinned",
        "line 11: calls ops.set_status (the Manager's)",
        "line 20: writes self.view.waiting[rid]",
        "line 21: writes self.view.services['a'].pinned",
    ]


def test_the_owned_names_cover_the_world_and_its_states() -> None:
    assert {"announced", "admin_unload", "last_evicted_at", "calibration", "queue"} <= OWNED
    assert "phase" in OWNED and RequestPhase.WAITING.value == "waiting"
    assert {"waiting", "inflight", "ledger", "services", "loaded", "learned"} <= OWNED
