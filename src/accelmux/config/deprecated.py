"""Old spellings the config still reads: each is taken as its new spelling and reported.

Loading replaces each old spelling by the new one before validation and keeps one
notice per replacement, with its key path (:func:`modernize`); ``accelmux check`` prints
them and ``accelmux serve`` logs them once at start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class RenamedValue:
    """A value that was renamed: ``old`` at a key path (``*`` matches any key) is ``new``.

    ``name`` names the deprecation in every notice (search the docs or the changelog for
    it); ``since`` is the accelmux version whose configs it first appeared in."""

    name: str
    path: tuple[str, ...]
    old: str
    new: str
    why: str
    since: str

    def notice(self, where: str) -> str:
        return (
            f"{where}: {self.old!r} is deprecated ({self.name}, since accelmux {self.since}), "
            f"write {self.new!r} ({self.why})"
        )


RENAMED_VALUES: tuple[RenamedValue, ...] = (
    RenamedValue(
        "inprocess-backend",
        ("services", "*", "backend", "type"),
        "inprocess",
        "worker",
        "the model runs in accelmux's inference worker process, not in the daemon's",
        "0.1.0",
    ),
)


def _replace(
    data: Any, path: tuple[str, ...], rule: RenamedValue, at: str
) -> tuple[Any, list[str]]:
    """``data`` with ``rule`` applied under ``path`` (a copy where it changed)."""
    if not isinstance(data, dict):
        return data, []
    head, rest = path[0], path[1:]
    keys = [k for k in data if isinstance(k, str)] if head == "*" else [head]
    out, notices = data, []
    for key in keys:
        if key not in data:
            continue
        where = f"{at}.{key}" if at else key
        if rest:
            value, found = _replace(data[key], rest, rule, where)
        elif data[key] == rule.old:
            value, found = rule.new, [rule.notice(where)]
        else:
            continue
        if found:
            if out is data:
                out = dict(data)
            out[key] = value
            notices += found
    return out, notices


def modernize(data: Any) -> tuple[Any, list[str]]:
    """``data`` (a config or scenario as parsed YAML) with every old spelling replaced by
    its new one, and one notice per replacement; ``data`` itself is never changed."""
    notices: list[str] = []
    for rule in RENAMED_VALUES:
        data, found = _replace(data, rule.path, rule, "")
        notices += found
    return data, notices
