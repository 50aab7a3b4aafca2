"""Render the configuration reference (docs/configuration.md) from the schema itself.

The schema's field descriptions are the single source: ``accelmux check --reference``
prints this page, and a test keeps the committed copy in step with the code.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ByteSize
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from accelmux.config.backends import (
    ExternalBackendConfig,
    FakeBackendConfig,
    WorkerBackendConfig,
)
from accelmux.config.cluster import ClusterConfig
from accelmux.config.deprecated import RENAMED_VALUES
from accelmux.config.limits import LimitsConfig
from accelmux.config.schema import (
    AccelmuxConfig,
    DegradeConfig,
    DeviceConfig,
    HostConfig,
    MemoryConfig,
    PolicyConfig,
    QueueConfig,
    ServiceConfig,
    ShrinkConfig,
    SloConfig,
)
from accelmux.config.server import HistoryConfig, ServerConfig
from accelmux.config.wyoming import WyomingConfig

#: (heading, key path shown to the reader, model) in page order.
SECTIONS: tuple[tuple[str, str, type[BaseModel]], ...] = (
    ("Top level", "", AccelmuxConfig),
    ("Devices", "devices.NAME", DeviceConfig),
    ("Services", "services.NAME", ServiceConfig),
    ("Service memory profile", "services.NAME.memory", MemoryConfig),
    ("Service queue", "services.NAME.queue", QueueConfig),
    ("Service latency objectives", "services.NAME.slo", SloConfig),
    ("Service degrading (CPU fallback, partial offload)", "services.NAME.degrade", DegradeConfig),
    ("Service batch shrinking", "services.NAME.shrink", ShrinkConfig),
    ("Backend: external (supervised server)", "services.NAME.backend", ExternalBackendConfig),
    ("Backend: worker (accelmux's inference worker)", "services.NAME.backend", WorkerBackendConfig),
    ("Backend: fake (test double)", "services.NAME.backend", FakeBackendConfig),
    ("Policy", "policy", PolicyConfig),
    ("Host RAM for parked models", "host", HostConfig),
    ("Server", "server", ServerConfig),
    ("Server: request limits", "server.limits", LimitsConfig),
    ("Server: request history (docs/plan.md)", "server.history", HistoryConfig),
    ("Server: Wyoming (Home Assistant voice)", "server.wyoming", WyomingConfig),
    ("Cluster (several machines on Ray)", "cluster", ClusterConfig),
)

HEADER = """# Configuration reference

Generated from the schema by `accelmux check --reference`; do not edit by hand.

A config is one YAML file. Unknown keys are errors. Sizes accept `4.9GiB`, `512MiB`,
`300MB` or a number of bytes. `accelmux check FILE` lists every problem with its key
path and the offending value.
"""


def _type_name(annotation: Any) -> str:
    if annotation is None or annotation is type(None):
        return "null"
    if annotation is ByteSize:
        return "size"
    origin = get_origin(annotation)
    if origin is typing.Annotated:
        return _type_name(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(annotation))
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in get_args(annotation))
    if origin in (list, tuple):
        args = get_args(annotation)
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        args = get_args(annotation)
        return f"map of {_type_name(args[1])}" if args else "map"
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return "section"
        if hasattr(annotation, "__members__"):
            return " \\| ".join(f"`{m.value}`" for m in annotation.__members__.values())
        return {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}.get(
            annotation.__name__, annotation.__name__
        )
    return str(annotation)


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        made = field.default_factory()  # type: ignore[call-arg]
        if isinstance(made, BaseModel):
            return "(its defaults)"
        if isinstance(made, list) and made:
            return "`[" + ", ".join(str(getattr(m, "value", m)) for m in made) + "]`"
        return "(empty)"
    value = field.default
    if value is PydanticUndefined:
        return "required"
    if value is None:
        return "none"
    if isinstance(value, ByteSize):
        return f"`{value.human_readable()}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if hasattr(value, "value"):
        return f"`{value.value}`"
    return f"`{value}`"


def render_reference() -> str:
    lines = [HEADER]
    for heading, path, model in SECTIONS:
        lines.append(f"## {heading}\n")
        doc = (model.__doc__ or "").strip().splitlines()
        if doc and not doc[0].startswith("Usage docs"):
            lines.append(doc[0] + "\n")
        lines.append("| key | type | default | meaning |")
        lines.append("|---|---|---|---|")
        for name, field in model.model_fields.items():
            key = field.alias or name
            full = f"{path}.{key}" if path else key
            desc = (field.description or "").replace("|", "\\|")
            lines.append(
                f"| `{full}` | {_type_name(field.annotation)} | {_default(field)} | {desc} |"
            )
        lines.append("")
    lines.append("## Old spellings\n")
    lines.append(
        "Still read, each as its new spelling; `accelmux check` names every one a file uses "
        "with its key path, and `accelmux serve` logs it at start.\n"
    )
    lines.append("| key | old | new | why |")
    lines.append("|---|---|---|---|")
    for rule in RENAMED_VALUES:
        key = ".".join("NAME" if part == "*" else part for part in rule.path)
        lines.append(f"| `{key}` | `{rule.old}` | `{rule.new}` | {rule.why} |")
    lines.append("")
    return "\n".join(lines)
