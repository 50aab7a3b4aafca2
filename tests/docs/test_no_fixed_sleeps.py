"""No test sleeps a fixed time and then asserts: it waits on the condition with a deadline.

A fixed ``time.sleep(...)`` / ``await asyncio.sleep(...)`` statement followed, in the same
block, by an ``assert`` (or a statement holding one) guesses how long the system needs and
races on a loaded machine. ``tests/waiting.py`` has ``wait_until`` / ``async_wait_until``.
A sleep that ends a polling loop's body has no later statement in its block and is fine,
and so is ``sleep(0)`` (a yield to the event loop, not a wait). The allowlist holds only
sleeps that are themselves what is tested (a quiet period, a random kill point), each
with its reason.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

QUIET = "a paused stream must send nothing for this long: the sleep is the observation"
#: (path under tests/, enclosing function, the sleep statement) -> why it may stay.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("external/test_llama_park.py", "_paused", "await asyncio.sleep(0.3)"): QUIET,
    ("real/test_pause_worker.py", "body", "await asyncio.sleep(QUIET_S)"): QUIET,
    ("real/test_pause_worker.py", "body", "await asyncio.sleep(0.05)"): (
        "lets the chunks sent before the pause arrive, so the quiet period that follows "
        "counts only what the paused stream sends"
    ),
    (
        "jobs/test_kill9.py",
        "test_sigkill_at_random_moments_loses_and_duplicates_nothing",
        "time.sleep(rng.uniform(0.1, 0.8))",
    ): ("a random kill point is the thing tested (the seed picks it)"),
    ("live/test_policy_http.py", "body", "await asyncio.sleep(0.3)"): (
        "a window in which a load/unload loop would show: counting loads in it is the check"
    ),
    ("reliability/test_hardening.py", "body", "await asyncio.sleep(0.2)"): (
        "refused unloads must change nothing: the sleep is the window the check looks at"
    ),
    (
        "reliability/test_jobs_daemon.py",
        "test_windows_spare_memory_cancel_and_cli",
        "time.sleep(1.0)",
    ): ("a paused job must stay paused: the sleep is the window the check looks at"),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class FixedSleep:
    path: str
    line: int
    function: str
    statement: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.path, self.function, self.statement)


def _sleep_seconds(stmt: ast.stmt) -> ast.expr | None:
    """The duration argument when ``stmt`` is a bare (awaited) ``...sleep(x)`` call."""
    if not isinstance(stmt, ast.Expr):
        return None
    call = stmt.value.value if isinstance(stmt.value, ast.Await) else stmt.value
    if not isinstance(call, ast.Call) or not call.args:
        return None
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return call.args[0] if name == "sleep" else None


def _holds_assert(stmt: ast.stmt) -> bool:
    return any(isinstance(node, ast.Assert) for node in ast.walk(stmt))


def fixed_sleeps(source: str, path: str) -> list[FixedSleep]:
    """Every sleep statement that a later statement of its block asserts after."""
    found: list[FixedSleep] = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name
        for field in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for index, stmt in enumerate(block):
                seconds = _sleep_seconds(stmt) if isinstance(stmt, ast.stmt) else None
                yields_only = isinstance(seconds, ast.Constant) and seconds.value == 0
                later = block[index + 1 :]
                if seconds is not None and not yields_only and any(map(_holds_assert, later)):
                    found.append(
                        FixedSleep(
                            path=path,
                            line=stmt.lineno,
                            function=function,
                            statement=ast.unparse(stmt),
                        )
                    )
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(source), "<module>")
    return found


def test_the_check_finds_a_sleep_before_an_assert() -> None:
    source = (
        "import asyncio, time\n"
        "async def body(x):\n"
        "    await asyncio.sleep(0.3)\n"
        "    assert x\n"
        "def poll(x):\n"
        "    while not x():\n"
        "        time.sleep(0.01)\n"  # ends a polling loop: fine
        "    assert x()\n"
        "    time.sleep(1.5)\n"
        "    with open('f') as f:\n"
        "        assert f\n"
        "async def yields(x):\n"
        "    await asyncio.sleep(0)\n"
        "    assert x\n"
    )
    found = fixed_sleeps(source, "t.py")
    assert [(f.line, f.function) for f in found] == [(3, "body"), (9, "poll")]


def test_no_fixed_sleep_before_an_assertion() -> None:
    found = [
        sleep
        for path in sorted(TESTS.rglob("*.py"))
        for sleep in fixed_sleeps(path.read_text(), path.relative_to(TESTS).as_posix())
    ]
    new = [
        f"{f.path}:{f.line} ({f.function}): {f.statement}" for f in found if f.key not in ALLOWED
    ]
    assert not new, (
        "a fixed sleep before an assertion races on a loaded machine; wait on the condition "
        "with tests/waiting.py's wait_until / async_wait_until instead:\n" + "\n".join(new)
    )
    stale = sorted(set(ALLOWED) - {f.key for f in found})
    assert not stale, f"allowlist entries that match no sleep any more: {stale}"
