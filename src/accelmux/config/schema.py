"""The YAML configuration schema (pydantic v2).

A config names devices, services and policy knobs (and, for the daemon, the server
section and each service's backend). ``load_config`` validates a file and raises
:class:`~accelmux.errors.ConfigError` listing every problem with its key path and the
offending value. ``to_manager_spec`` turns a valid config into the core's plain specs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

from accelmux.config.backends import BackendConfig
from accelmux.config.cluster import NODE_NAME_PATTERN, ClusterConfig
from accelmux.config.server import ServerConfig
from accelmux.core.specs import DAY_S, Window
from accelmux.core.switches import unknown_switch_message, unknown_switches
from accelmux.core.types import Residency, ServiceClass, ServiceKind

Bytes = Annotated[ByteSize, Field(ge=0)]
PositiveBytes = Annotated[ByteSize, Field(gt=0)]
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_WINDOW = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$")


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class DeviceConfig(StrictModel):
    """One pool of accelerator memory."""

    kind: Literal["nvidia", "host", "virtual"] = Field(
        "virtual",
        description="nvidia (NVML), host (shared memory measured with psutil) or virtual "
        "(tests, simulation).",
    )
    index: int = Field(0, ge=0, description="GPU index (nvidia only)")
    capacity: PositiveBytes | None = Field(
        None, description="Total memory. Required for virtual; detected for nvidia/host."
    )
    budget: PositiveBytes | None = Field(
        None, description="What accelmux may use (default: capacity; host: see docs)."
    )
    headroom: Bytes = Field(ByteSize(512 * 1024**2), description="Kept free for peaks.")
    load_bandwidth: PositiveBytes = Field(
        ByteSize(2 * 10**9), description="Bytes per second when loading weights."
    )
    host_bandwidth: PositiveBytes = Field(
        ByteSize(12 * 10**9),
        description="Bytes per second when loading weights held in host RAM (a parked "
        "or sleeping service); the first measured loads replace it.",
    )
    foreign_pid_dir: str | None = Field(
        None,
        description="virtual only (tests, demos): a directory of *.pid files; the memory of "
        "those processes (and their children) is measured and counted as foreign usage.",
    )


class MemoryConfig(StrictModel):
    """A service's memory profile. Sizes accept 4.9GiB, 512MiB, 300MB or bytes."""

    weights: Bytes = Field(ByteSize(0), description="Model weights resident while loaded.")
    runtime: Bytes = Field(
        ByteSize(0), description="Context, libraries and allocator minimum while loaded."
    )
    kv_per_token: Bytes = Field(ByteSize(0), description="LLM KV bytes per token.")
    kv_floor: Bytes = Field(ByteSize(0), description="Smallest KV pool (elastic floor).")
    kv_ceiling: Bytes = Field(ByteSize(0), description="Largest KV pool (elastic ceiling).")
    workspace: Bytes = Field(ByteSize(0), description="Fixed activation bytes per request.")
    per_unit: Bytes = Field(
        ByteSize(0),
        description="Bytes per request unit: megapixel (image, detect), second of audio "
        "(asr), character (tts), text (embeddings).",
    )
    gguf: str | None = Field(
        None, description="Estimate weights and kv_per_token from this GGUF file."
    )


class QueueConfig(StrictModel):
    limit: int = Field(32, ge=0, description="Waiting requests beyond which new ones get 429.")
    deadline_s: float = Field(30.0, gt=0, description="Longest wait before a 503.")


class SloConfig(StrictModel):
    """Latency objectives, judged per request; a pinned service yields only within its own.

    The daemon and the simulator judge each request by them. One decision reads them: a
    pinned service yields its memory to a voice request only where its reload keeps its
    own objective.

    The daemon's share of requests that met them over the last 5 minutes, per service
    and per class, is in /admin/status, /metrics, the dashboard and `accelmux top`; the
    simulator's report uses the same rule."""

    latency_s: float | None = Field(None, gt=0, description="Whole-request latency objective.")
    ttft_s: float | None = Field(None, gt=0, description="LLM time to first token objective.")
    tbt_s: float | None = Field(None, gt=0, description="LLM time between tokens objective.")


class ShrinkConfig(StrictModel):
    """How a batch service may shrink under memory pressure: when the activation memory
    of a request at its full batch cannot be held without evicting a higher class or
    stopping work, it runs in smaller batches (halving, down to ``min_batch_fraction``)
    that fit in free memory, and fewer requests at once; it grows back when free memory
    holds a larger batch again."""

    min_batch_fraction: float = Field(
        0.25,
        gt=0,
        lt=1,
        description="The smallest share of a request's batch (its units: inputs, audio "
        "seconds, megapixels) it may run with at a time.",
    )
    min_parallel: int = Field(
        1,
        ge=1,
        description="The fewest requests it runs at once while shrunk (its concurrency "
        "shrinks with its batch, never below this).",
    )


class DegradeConfig(StrictModel):
    """How a service may run when its GPU cannot hold it without evicting a higher class:
    on the CPU (a host device), or with fewer of its layers on the GPU (llama.cpp). The
    policy picks the best form that fits and moves the service back when room returns."""

    fallback_device: str | None = Field(
        None,
        description="A host device to run it on (its weights in host RAM, the CPU computing).",
    )
    min_gpu_layers: int | None = Field(
        None,
        ge=1,
        description="Partial offload (llama.cpp): the fewest layers worth keeping on the GPU.",
    )
    max_gpu_layers: int | None = Field(
        None,
        ge=1,
        description="Partial offload: the most layers of a partial offload (fewer than all).",
    )
    layers: int | None = Field(
        None,
        ge=2,
        description="The model's layers as llama.cpp counts them (its blocks and the "
        "output layer); read from memory.gguf when that is set.",
    )
    cpu_slowdown: float = Field(
        8.0,
        ge=1.0,
        le=1000.0,
        description="How many times longer a request takes on the CPU than on the GPU: "
        "the policy's estimate when it weighs the forms (a layer split is the share of "
        "layers on the CPU at this speed).",
    )

    @model_validator(mode="after")
    def _check(self) -> DegradeConfig:
        fewest, most = self.min_gpu_layers, self.max_gpu_layers
        if (fewest is None) != (most is None):
            raise ValueError("give min_gpu_layers and max_gpu_layers together, or neither")
        if fewest is not None and most is not None and fewest > most:
            raise ValueError(f"min_gpu_layers {fewest} is more than max_gpu_layers {most}")
        if self.fallback_device is None and fewest is None:
            raise ValueError("declare a fallback_device, a layer range, or both")
        return self

    @property
    def offload(self) -> bool:
        return self.min_gpu_layers is not None


class ServiceConfig(StrictModel):
    kind: ServiceKind = Field(description="What the service does; decides its endpoint.")
    service_class: Literal["realtime", "interactive", "batch", "background"] = Field(
        "interactive",
        alias="class",
        description="Priority: realtime > interactive > batch > background.",
    )
    residency: Residency = Field(
        Residency.WARM,
        description="pinned: kept loaded, evicted only for a voice request nothing else "
        "can make room for, when its reload is within its own slo or voice has gone "
        "unserved for 2 minutes (reloaded when room returns); warm: kept for ttl_s after "
        "use; on-demand: loaded per burst, evicted first.",
    )
    ttl_s: float = Field(
        300.0,
        ge=0,
        description="Unload after this idle time once the device's memory is not spare "
        "(while it is, an idle service stays loaded: policy heuristic idle_keep).",
    )
    device: str | None = Field(
        None, description="The one device it runs on (default: see `devices`)."
    )
    devices: list[str] | None = Field(
        None,
        min_length=1,
        description="Devices it may run on: the policy places it, and may keep a replica "
        "on more than one (default: every device it fits on; a pinned service is placed "
        "once, at start).",
    )
    model: str | None = Field(None, description="Model name clients send (default: service).")
    aliases: list[str] = Field(default_factory=list, description="More model names to accept.")
    concurrency: int = Field(1, ge=1, le=1024, description="Requests it runs at once.")
    init_s: float = Field(1.0, ge=0, description="Start-up time beyond reading weights.")
    load_timeout_s: float = Field(
        600.0,
        gt=0,
        le=86_400,
        description="A load (any backend type) still running after this fails with a timeout.",
    )
    memory: MemoryConfig = Field(default_factory=MemoryConfig, description="Memory profile.")
    queue: QueueConfig = Field(default_factory=QueueConfig, description="Waiting limits.")
    slo: SloConfig = Field(default_factory=SloConfig, description="Latency objectives.")
    windows: list[str] = Field(
        default_factory=list, description='Maintenance windows, "HH:MM-HH:MM" local time.'
    )
    steady: bool | None = Field(
        None,
        description="A steady stream of frames (a camera): batch work may not evict it nor "
        "stop its requests, so a maintenance window never costs a camera its frames; "
        "realtime and interactive work still may. It ranks above batch when room is made: "
        "its load evicts idle batch services and stops batch work to get its memory back, "
        "its frames evict idle batch services, batch loads leave its next frame free, and "
        "realtime work does not hold its frames back (default: true for kind camera, and "
        "in a scenario for a service a camera workload feeds).",
    )
    backend: BackendConfig | None = Field(
        None, description="How it runs: external, worker or fake (none: simulation only)."
    )
    degrade: DegradeConfig | None = Field(
        None,
        description="Run on the CPU or with fewer layers on the GPU instead of waiting "
        "when its GPU cannot hold it without evicting a higher class (see docs/gpu.md).",
    )
    shrink: ShrinkConfig | None = Field(
        None,
        description="A batch or background service: run smaller batches, and fewer at "
        "once, instead of waiting when memory is short (see docs/gpu.md).",
    )
    nodes: list[Annotated[str, Field(pattern=NODE_NAME_PATTERN)]] | None = Field(
        None,
        description="Cluster mode: the nodes it may run on (none: every node). A single "
        "machine ignores it.",
    )

    @field_validator("windows")
    @classmethod
    def _check_windows(cls, value: list[str]) -> list[str]:
        for text in value:
            parse_window(text)
        return value

    @property
    def cls(self) -> ServiceClass:
        return ServiceClass.parse(self.service_class)


#: Every policy ``policy.name`` may name: accelmux and the simulator's baselines. A list
#: here, not the policy registry: the baselines join that registry when their package is
#: imported, and what a config accepts must not depend on what was imported before it
#: (``tests/sim/test_baselines_config.py`` keeps the list and the registry in step).
POLICY_NAMES = ("accelmux", "independent", "static", "ollama+containers", "llama-swap", "oracle")


class PolicyConfig(StrictModel):
    name: str = Field(
        "accelmux",
        description="accelmux; or, run for comparison at its shipped settings, one of the "
        "simulator's baselines (accelmux.sim.baselines): independent, static, "
        "ollama+containers, llama-swap, oracle.",
    )
    safety_factor: float = Field(
        1.2, ge=1.0, le=10.0, description="Multiplier on estimates until calibrated."
    )
    calibration_window: int = Field(
        64, ge=1, le=10_000, description="Observed peaks kept per service for calibration."
    )
    on_demand_ttl_s: float = Field(
        30.0,
        ge=0,
        description="Idle time before on-demand unload once its device's memory is wanted.",
    )
    reuse_horizon_s: float = Field(
        600.0, gt=0, description="Horizon of the reuse probability in the victim score."
    )
    spare_fraction: float = Field(
        0.25,
        ge=0,
        lt=1,
        description="Budget share that must stay free for batch work "
        "outside its windows and for prewarming.",
    )
    crash_backoff_s: float = Field(1.0, gt=0, description="First restart delay after a crash.")
    crash_backoff_max_s: float = Field(60.0, gt=0, description="Longest restart delay.")
    balloon_idle_s: float = Field(
        30.0, ge=0, description="Idle time before a KV pool shrinks back to its floor."
    )
    realtime_grace_s: float | None = Field(
        None,
        ge=0,
        le=60,
        description="After a realtime request ends, batch and background work stay held "
        "this long on its device (the next step of a voice chain follows within it). "
        "Unset: 0.25 s on a host device (CPU cores or shared memory, where anything "
        "started beside voice slows it), none on a discrete GPU.",
    )
    batch_age_fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Opt-in: a batch request that has waited this share of its queue "
        "deadline may evict idle interactive models (none of their requests waiting) to "
        "load or run, so batch work does not wait out its deadline behind chat models left "
        "warm. Unset: no request ages. Off by default: an evicted chat model may not get "
        "its memory back while a foreign program holds part of the device "
        '(docs/architecture.md, "Batch ageing, opt-in").',
    )
    batch_slice_s: float = Field(
        0.1,
        ge=0,
        le=60,
        description="While a realtime service is loaded on its device, a job's batch is cut "
        "to about this much compute (paced by its last batches): a voice request that "
        "arrives shares the device with at most this much batch work already running. "
        "0 keeps every batch whole.",
    )
    prewarm: bool = Field(True, description="Reload likely-reused services into spare memory.")
    disable: list[str] = Field(
        default_factory=list,
        description="Heuristics of the accelmux policy to turn off (ablation); each name "
        "must be one of `accelmux.core.switches.Switch` (listed in "
        "docs/architecture.md).",
    )

    @field_validator("disable")
    @classmethod
    def _known_heuristics(cls, value: list[str]) -> list[str]:
        unknown = unknown_switches(value)
        if unknown:
            raise ValueError(unknown_switch_message(unknown))
        return value


class HostConfig(StrictModel):
    """Host RAM that unloaded models may keep their weights in."""

    park_budget: Bytes | None = Field(
        None,
        description="Host RAM for parked and sleeping weights and parked KV state "
        "(default: a quarter of the host's RAM; the simulator: its page cache; 0: every "
        "unload is cold).",
    )


class AccelmuxConfig(StrictModel):
    devices: dict[Annotated[str, Field(pattern=NAME_PATTERN)], DeviceConfig] = Field(
        min_length=1, description="Memory pools by name (at least one)."
    )
    services: dict[Annotated[str, Field(pattern=NAME_PATTERN)], ServiceConfig] = Field(
        default_factory=dict, description="Services by name."
    )
    policy: PolicyConfig = Field(default_factory=PolicyConfig, description="Policy knobs.")
    host: HostConfig = Field(default_factory=HostConfig, description="Host RAM for parking.")
    server: ServerConfig = Field(default_factory=ServerConfig, description="The daemon.")
    cluster: ClusterConfig = Field(
        default_factory=ClusterConfig, description="Several machines on Ray (docs/cluster.md)."
    )
    #: Old spellings the loader read as new ones (:mod:`accelmux.config.deprecated`).
    _deprecations: tuple[str, ...] = PrivateAttr(default=())

    @property
    def deprecations(self) -> tuple[str, ...]:
        """One notice per old spelling the file used: its key path and the new spelling."""
        return self._deprecations

    def note_deprecations(self, notices: Iterable[str]) -> None:
        self._deprecations = tuple(notices)

    #: Where the config came from and the SHA-256 of its text (``/admin/status``).
    _source: tuple[str, str] | None = PrivateAttr(default=None)

    @property
    def source(self) -> tuple[str, str] | None:
        """(the config file's absolute path, or a label such as ``default stack``; the
        SHA-256 hex of its text), None for a config built in code."""
        return self._source

    def note_source(self, where: str, sha256: str) -> None:
        self._source = (where, sha256)

    def device_of(self, service: str) -> str:
        """The first device ``service`` may run on."""
        return self.devices_of(service)[0]

    def devices_of(self, service: str) -> list[str]:
        """The devices ``service`` may run on, in config order: its ``device``, else its
        ``devices``, else every device."""
        svc = self.services[service]
        if svc.device is not None:
            return [svc.device]
        if svc.devices is not None:
            return list(dict.fromkeys(svc.devices))
        return list(self.devices)


def parse_window(text: str) -> Window:
    """Parse "HH:MM-HH:MM" into a :class:`Window` (may wrap midnight)."""
    m = _WINDOW.match(text)
    if not m:
        raise ValueError(f'window {text!r} is not "HH:MM-HH:MM"')
    h1, m1, h2, m2 = (int(g) for g in m.groups())
    if h1 > 23 or h2 > 24 or m1 > 59 or m2 > 59 or (h2 == 24 and m2 != 0):
        raise ValueError(f"window {text!r} has an invalid time")
    start, end = h1 * 3600 + m1 * 60, h2 * 3600 + m2 * 60
    if start == end % DAY_S:
        raise ValueError(f"window {text!r} is empty")
    return Window(start_s=float(start), end_s=float(end))


def model_json_schema() -> dict[str, Any]:
    return AccelmuxConfig.model_json_schema(by_alias=True)
