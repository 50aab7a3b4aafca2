"""Lazy imports of the optional model runtimes.

Nothing in :mod:`accelmux.models` imports a heavy runtime at module import time:
each wrapper calls :func:`require` inside ``load()`` (or the first method that
needs it), so ``import accelmux.models`` works on a machine without them.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from types import ModuleType

from accelmux.errors import BackendError

SETUP_HINT = (
    "run `accelmux setup` (scripts/setup-models.sh in a checkout) to install the model "
    "runtimes and model packages"
)


def require(module: str, package: str) -> ModuleType:
    """Import ``module`` or raise :class:`BackendError` naming the PyPI ``package``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise BackendError(
            f"the Python package {package!r} (module {module!r}) is not installed or failed "
            f"to import ({exc}); {SETUP_HINT}"
        ) from exc


def package_dir(module: str, package: str) -> Path:
    """Directory of an installed package, found without importing (executing) it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:  # pragma: no cover - broken installs only
        raise BackendError(f"cannot locate package {package!r}: {exc}; {SETUP_HINT}") from exc
    if spec is None or not spec.submodule_search_locations:
        raise BackendError(
            f"the model package {package!r} (module {module!r}) is not installed; {SETUP_HINT}"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def is_available(module: str) -> bool:
    """True when ``module`` can be found (it is not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
