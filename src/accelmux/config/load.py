"""Load and validate a config file; every problem is reported with its key path."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from accelmux.config.backends import (
    ExternalBackendConfig,
    WorkerBackendConfig,
    argv_placeholder_problem,
    external_problems,
)
from accelmux.config.degrade import degrade_problems
from accelmux.config.deprecated import modernize
from accelmux.config.schema import POLICY_NAMES, AccelmuxConfig
from accelmux.config.shrink import shrink_problems
from accelmux.core.placement import place_pinned
from accelmux.errors import ConfigError

MAX_CONFIG_BYTES = 1024 * 1024
#: The variable accelmux sets to an external server's GPU (per replica).
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe loader that refuses duplicate keys instead of silently keeping the last."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    mapping: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node)
        if key in mapping:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (line {mark.line + 1})", mark
            )
        mapping[key] = loader.construct_object(value_node)
    return mapping


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,
)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def format_validation_error(exc: ValidationError) -> list[str]:
    problems = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        problems.append(f"{path}: {msg} (got {_short(err.get('input'))})")
    return problems


def parse_yaml(text: str, source: str) -> object:
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(source, [f"not valid YAML{where}: {problem}"]) from None


def load_config_data(data: object, source: str, base_dir: Path | None = None) -> AccelmuxConfig:
    """Validate parsed YAML; old spellings are read as new ones (``cfg.deprecations``)."""
    if not isinstance(data, dict):
        raise ConfigError(source, [f"(top level): expected a mapping, got {_short(data)}"])
    data, notices = modernize(data)
    try:
        cfg = AccelmuxConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, format_validation_error(exc)) from None
    problems = semantic_problems(cfg, base_dir)
    if problems:
        raise ConfigError(source, problems)
    cfg.note_deprecations(notices)
    return cfg


def load_config_text(
    text: str, source: str = "<config>", base_dir: Path | None = None
) -> AccelmuxConfig:
    return load_config_data(parse_yaml(text, source), source, base_dir)


def read_text(path: Path) -> str:
    source = str(path)
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(source, [f"file is larger than {MAX_CONFIG_BYTES} bytes"])
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(source, ["file not found"]) from None
    except IsADirectoryError:
        raise ConfigError(source, ["is a directory, expected a YAML file"]) from None
    except PermissionError:
        raise ConfigError(source, ["permission denied"]) from None
    except UnicodeDecodeError:
        raise ConfigError(source, ["not UTF-8 text"]) from None


def load_config(path: str | Path) -> AccelmuxConfig:
    """The config in file ``path``, which it remembers with the SHA-256 of its text
    (``cfg.source``: what ``sha256sum`` prints for the file)."""
    p = Path(path)
    text = read_text(p)
    cfg = load_config_text(text, str(p), p.parent)
    try:
        digest = hashlib.sha256(p.read_bytes()).hexdigest()  # the bytes, as sha256sum reads
    except OSError:
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    cfg.note_source(str(p.absolute()), digest)
    return cfg


def _resolve(path: str, base_dir: Path | None) -> Path:
    p = Path(path).expanduser()
    if not p.is_absolute() and base_dir is not None:
        p = base_dir / p
    return p


def _usable(cfg: AccelmuxConfig, device: str) -> int | None:
    """A device's budget less headroom, None when its size is left to detection."""
    dev = cfg.devices[device]
    limit = dev.budget or dev.capacity
    return None if limit is None else int(limit - dev.headroom)


def _fits(cfg: AccelmuxConfig, device: str, nbytes: int) -> bool:
    usable = _usable(cfg, device)
    return usable is None or nbytes <= usable


def semantic_problems(cfg: AccelmuxConfig, base_dir: Path | None = None) -> list[str]:
    """Cross-field checks pydantic cannot express field by field."""
    problems: list[str] = []
    for name, dev in cfg.devices.items():
        key = f"devices.{name}"
        if dev.kind == "virtual" and dev.capacity is None:
            problems.append(f"{key}.capacity: required for a virtual device (got None)")
        limit = dev.budget or dev.capacity
        if dev.budget is not None and dev.capacity is not None and dev.budget > dev.capacity:
            problems.append(
                f"{key}.budget: larger than capacity {dev.capacity.human_readable()} "
                f"(got {dev.budget.human_readable()})"
            )
        if limit is not None and dev.headroom >= limit:
            problems.append(
                f"{key}.headroom: must be smaller than the budget "
                f"(got {dev.headroom.human_readable()})"
            )

    seen_models: dict[str, str] = {}
    pinned_floor: dict[str, int] = {}
    pinned: list[tuple[str, int, list[str]]] = []
    replicated: dict[str, list[str]] = {}  # service -> the devices of its replicas
    for name, svc in cfg.services.items():
        key = f"services.{name}"
        if svc.device is not None and svc.devices is not None:
            problems.append(f"{key}.devices: give device or devices, not both (got both)")
            continue
        if svc.device is not None and svc.device not in cfg.devices:
            problems.append(f"{key}.device: unknown device (got {svc.device!r})")
            continue
        unknown = [d for d in svc.devices or () if d not in cfg.devices]
        if unknown:
            problems.append(f"{key}.devices: unknown device (got {', '.join(unknown)})")
            continue
        mem = svc.memory
        if mem.kv_floor > mem.kv_ceiling:
            problems.append(
                f"{key}.memory.kv_floor: larger than kv_ceiling "
                f"(got {mem.kv_floor.human_readable()})"
            )
        if svc.kind.is_llm and mem.kv_per_token > 0 and mem.kv_ceiling == 0 and not mem.gguf:
            problems.append(
                f"{key}.memory.kv_ceiling: required for an LLM with kv_per_token (got 0)"
            )
        if mem.gguf and not _resolve(mem.gguf, base_dir).is_file():
            problems.append(f"{key}.memory.gguf: file not found (got {mem.gguf!r})")
        backend = svc.backend
        if (
            isinstance(backend, WorkerBackendConfig)
            and backend.model_path
            and not _resolve(backend.model_path, base_dir).exists()
        ):
            problems.append(f"{key}.backend.model_path: not found (got {backend.model_path!r})")
        for model in [svc.model or name, *svc.aliases]:
            if model in seen_models:
                problems.append(
                    f"{key}.model: name {model!r} already used by service {seen_models[model]!r}"
                )
            seen_models[model] = name
        floor = mem.weights + mem.runtime + mem.kv_floor
        explicit = svc.device is not None or svc.devices is not None
        candidates = cfg.devices_of(name)
        fitting = [d for d in candidates if _fits(cfg, d, floor + mem.workspace)]
        too_small = [d for d in candidates if d not in fitting]
        # a service that degrades may be too large for its GPU: its lesser forms run
        if too_small and (explicit or not fitting) and svc.degrade is None:
            usable = _usable(cfg, too_small[0])
            problems.append(
                f"{key}.memory: needs {floor + mem.workspace} B to run but device "
                f"{too_small[0]!r} offers {usable} B after headroom "
                f"(got weights={mem.weights.human_readable()})"
            )
        if svc.residency.value == "pinned" and fitting:
            pinned.append((name, floor, fitting))
        elif len(fitting) > 1:
            replicated[name] = fitting

    room = {d: _usable(cfg, d) or 0 for d in cfg.devices}
    for name, device in place_pinned(room, pinned).items():
        pinned_floor[device] = pinned_floor.get(device, 0) + next(
            f for n, f, _ in pinned if n == name
        )
    for device, floor in pinned_floor.items():
        dev = cfg.devices[device]
        limit = dev.budget or dev.capacity
        if limit is not None and floor > limit - dev.headroom:
            problems.append(
                f"devices.{device}: pinned services need {floor} B, more than the budget "
                f"minus headroom ({limit - dev.headroom} B): an impossible budget"
            )

    ports: dict[int, str] = {cfg.server.port: "server.port"}
    for name, svc in cfg.services.items():
        if isinstance(svc.backend, ExternalBackendConfig):
            for i, arg in enumerate(svc.backend.argv):
                why = argv_placeholder_problem(arg)
                if why is not None:
                    problems.append(f"services.{name}.backend.argv[{i}]: {why}")
            for why in external_problems(svc.backend, svc.kind):
                problems.append(f"services.{name}.backend.{why}")
            if name in replicated:
                problems += replica_problems(cfg, name, svc.backend, replicated[name])
        if isinstance(svc.backend, ExternalBackendConfig) and svc.backend.port is not None:
            where = f"services.{name}.backend.port"
            if svc.backend.port in ports:
                problems.append(
                    f"{where}: port already used by {ports[svc.backend.port]} "
                    f"(got {svc.backend.port})"
                )
            ports[svc.backend.port] = where

    problems += wyoming_problems(cfg)
    problems += cluster_problems(cfg)
    problems += degrade_problems(cfg)
    problems += shrink_problems(cfg)
    if cfg.policy.name not in POLICY_NAMES:
        problems.append(
            f"policy.name: unknown policy (got {cfg.policy.name!r}; known: "
            f"{', '.join(sorted(POLICY_NAMES))})"
        )
    return problems


def replica_problems(
    cfg: AccelmuxConfig, service: str, backend: ExternalBackendConfig, devices: list[str]
) -> list[str]:
    """Why an external server cannot run one replica per device of ``devices``: each
    replica is a process of its own, on its own port and (NVIDIA) its own GPU."""
    key = f"services.{service}.backend"
    on = ", ".join(devices)
    problems = []
    if backend.port is not None:
        problems.append(
            f"{key}.port: a fixed port cannot serve one replica per device ({on}); leave "
            f"port unset (each replica gets a free one) or give the service one device "
            f"(device: {devices[0]}) (got {backend.port})"
        )
    on_gpus = any(cfg.devices[d].kind == "nvidia" for d in devices)
    if on_gpus and CUDA_VISIBLE_DEVICES in backend.env:
        problems.append(
            f"{key}.env.{CUDA_VISIBLE_DEVICES}: accelmux sets it per replica to the "
            f"replica's GPU ({on}); remove it, or give the service one device "
            f"(got {backend.env[CUDA_VISIBLE_DEVICES]!r})"
        )
    return problems


def wyoming_problems(cfg: AccelmuxConfig) -> list[str]:
    """Cross-field checks of ``server.wyoming``: its services exist and have the right kind,
    at least one is there, and its port is not the gateway's."""
    wy = cfg.server.wyoming
    if wy is None:
        return []
    problems: list[str] = []
    for key in ("asr", "tts"):
        name = getattr(wy, key)
        if name is None:
            continue
        svc = cfg.services.get(name)
        if svc is None:
            problems.append(f"server.wyoming.{key}: unknown service (got {name!r})")
        elif svc.kind.value != key:
            problems.append(
                f"server.wyoming.{key}: service {name!r} is a {svc.kind.value} service, "
                f"not {key} (got {name!r})"
            )
    if not any(s.kind.value in ("asr", "tts") for s in cfg.services.values()):
        problems.append("server.wyoming: no asr or tts service to serve (got none)")
    if wy.port == cfg.server.port:
        problems.append(f"server.wyoming.port: already used by server.port (got {wy.port})")
    return problems


def cluster_problems(cfg: AccelmuxConfig) -> list[str]:
    """Each ``services.NAME.nodes`` entry is one of ``cluster.nodes`` when that is set."""
    known = cfg.cluster.nodes
    if not known:
        return []
    problems: list[str] = []
    for name, svc in cfg.services.items():
        for node in svc.nodes or []:
            if node not in known:
                problems.append(
                    f"services.{name}.nodes: unknown node (got {node!r}; cluster.nodes: "
                    f"{', '.join(known)})"
                )
    return problems
