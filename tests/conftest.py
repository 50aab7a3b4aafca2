"""Shared test configuration: the tiers, and which tests may run in parallel.

``pytest --hypothesis-profile=thorough`` runs the property tests with many more examples.

Tiers (``--tier``, docs/testing.md): ``fast`` is the edit-test loop, the pure tiers
(:data:`FAST_DIRS`) without the tests marked ``slow``; ``rest`` is everything else (the
whole suite runs the fast tier first in a virtualenv of its own, then the rest); ``all``
(the default) is every collected test.

Parallel or serial (docs/testing.md): ``scripts/test`` runs the tests that may share the
machine on several pytest-xdist workers, then the serial ones alone. A test is serial
when it is marked ``serial`` or lives in a directory of :data:`SERIAL_DIRS`.
The rule reads markers and directories only, so a new test lands on the right side
without being listed anywhere: mark a test ``serial`` when it measures the machine
(memory, CPU time, a latency bound), needs every core to meet a deadline, or holds a
fixed port.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("thorough", max_examples=2000, deadline=None)
# No per-example deadline by default: a timing bound is no pass/fail criterion, and on a
# shared 2-core machine an example of a pure function took 268 ms once (the default
# deadline is 200 ms). --hypothesis-profile=thorough still replaces this one.
settings.register_profile("untimed", deadline=None)
settings.load_profile("untimed")

TESTS = Path(__file__).resolve().parent
#: The pure tiers: no model, browser, llama-server or daemon process to install.
FAST_DIRS = frozenset({"core", "sim", "config", "docs", "plan"})
#: Tiers that cannot share the machine: real models (tests measure their memory and
#: latency), a real llama-server beside them, and Ray clusters (a dozen processes each).
SERIAL_DIRS = frozenset({"real", "external", "stack", "cluster"})
TIERS = ("all", "fast", "rest")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--tier",
        choices=TIERS,
        default="all",
        help="fast: the pure tiers without slow tests; rest: all but those; all (default)",
    )


def _tier_dir_of(path: Path) -> str | None:
    try:
        parts = path.resolve().relative_to(TESTS).parts
    except ValueError:
        return None
    return parts[0] if len(parts) > 1 else None


def tier_dir(item: pytest.Item) -> str | None:
    """The directory right under tests/ that holds ``item`` (None: outside tests/)."""
    return _tier_dir_of(Path(str(item.path)))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The fast tier does not even import the other tiers' modules (their imports of
    aiohttp, selenium, the clients... are most of the collection time)."""
    if config.getoption("--tier") != "fast":
        return None
    try:
        parts = collection_path.resolve().relative_to(TESTS).parts
    except ValueError:
        return None
    in_a_tier = len(parts) > 1 or (len(parts) == 1 and collection_path.is_dir())
    return True if in_a_tier and parts[0] not in FAST_DIRS else None


def in_fast_tier(item: pytest.Item) -> bool:
    return tier_dir(item) in FAST_DIRS and item.get_closest_marker("slow") is None


def is_serial(item: pytest.Item) -> bool:
    return item.get_closest_marker("serial") is not None or tier_dir(item) in SERIAL_DIRS


@pytest.hookimpl(tryfirst=True)  # before -m reads the markers added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tier = config.getoption("--tier")
    kept, dropped = [], []
    for item in items:
        if is_serial(item) and item.get_closest_marker("serial") is None:
            item.add_marker(pytest.mark.serial)  # so that -m serial / -m "not serial" split
        wanted = tier == "all" or (tier == "fast") == in_fast_tier(item)
        (kept if wanted else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
