"""A service's ``shrink:`` section: what is wrong with it (see :mod:`accelmux.core.shrink`)."""

from __future__ import annotations

from accelmux.config.schema import AccelmuxConfig
from accelmux.core.types import ServiceClass


def shrink_problems(cfg: AccelmuxConfig) -> list[str]:
    """Why a ``shrink:`` section cannot be honoured (each names its key)."""
    problems: list[str] = []
    for name, svc in cfg.services.items():
        if svc.shrink is None:
            continue
        key = f"services.{name}.shrink"
        if svc.cls < ServiceClass.BATCH:
            problems.append(
                f"{key}: only batch or background work shrinks its batch; a "
                f"{svc.cls.label} request keeps its latency (got class {svc.service_class!r})"
            )
        if svc.degrade is not None:
            problems.append(
                f"{key}: a service that degrades (degrade:) changes form instead; "
                "declare one of shrink or degrade"
            )
        if not svc.memory.gguf and float(svc.memory.per_unit) <= 0:
            problems.append(
                f"{key}: memory.per_unit is 0, so a smaller batch would hold no less "
                "activation memory; set memory.per_unit (bytes per unit of a request)"
            )
        if svc.shrink.min_parallel > svc.concurrency:
            problems.append(
                f"{key}.min_parallel: more than its concurrency "
                f"({svc.shrink.min_parallel} > {svc.concurrency})"
            )
    return problems
