"""Scenario files: the normal config keys plus ``workloads:`` and ``simulation:``.

A scenario is an :class:`~accelmux.config.schema.AccelmuxConfig` (``devices``,
``services``, ``policy``) extended with the simulated world:

- ``simulation``: duration, local start time, seeds, memory sampling period, the
  physical model's estimate error, per-service service-time models, foreign processes,
  and the device sizes to sweep;
- ``workloads``: a list of generators (``poisson``, ``gamma``, ``trace``, ``voice``,
  ``indexing``, ``camera``, ``recorded``), see :mod:`accelmux.sim.workloads`.

Validation is strict (unknown keys are errors) and every problem is reported with its
key path through :class:`~accelmux.errors.ConfigError`.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import ByteSize, Field, ValidationError, field_validator

from accelmux.config.deprecated import modernize
from accelmux.config.load import (
    format_validation_error,
    parse_yaml,
    read_text,
    semantic_problems,
)
from accelmux.config.schema import AccelmuxConfig, Bytes, StrictModel
from accelmux.config.specs import to_manager_spec
from accelmux.core.specs import Capabilities, ManagerSpec, ServiceSpec
from accelmux.core.types import GIB, ResizeSupport
from accelmux.errors import ConfigError
from accelmux.sim.baselines.config import BaselinePolicyConfig
from accelmux.sim.degrade_cost import DegradeCostConfig
from accelmux.sim.recorded import RecordedError, read_timeline, read_trace
from accelmux.sim.shrink_cost import ShrinkCostConfig

#: The Azure LLM trace 2023 (conversations), shipped inside the package (see traces/README.md).
DEFAULT_TRACE = str(Path(__file__).resolve().parent / "traces" / "azure_llm_2023_conv.csv")
_CLOCK = re.compile(r"^\s*(\d{1,2}):(\d{2})(?::(\d{2}(?:\.\d+)?))?\s*$")


def parse_clock(text: str) -> float:
    """ "HH:MM" (or "HH:MM:SS[.fff]", a recorded start) -> seconds since midnight."""
    m = _CLOCK.match(text)
    seconds = float(m.group(3) or 0.0) if m else 0.0
    if not m or int(m.group(1)) > 23 or int(m.group(2)) > 59 or seconds >= 60:
        raise ValueError(f'time {text!r} is not "HH:MM"')
    return int(m.group(1)) * 3600.0 + int(m.group(2)) * 60.0 + seconds


class DistConfig(StrictModel):
    """A positive random quantity: lognormal with ``mean`` and ``cv``, or ``choices``."""

    mean: float | None = Field(None, gt=0)
    cv: float = Field(0.0, ge=0, le=10)
    choices: list[Annotated[float, Field(ge=0)]] = Field(default_factory=list)
    min: float | None = Field(None, ge=0)
    max: float | None = Field(None, gt=0)

    def model_post_init(self, _context: object) -> None:
        if self.mean is None and not self.choices:
            raise ValueError("give mean (with cv) or choices")


Dist = Annotated[float, Field(ge=0)] | DistConfig


class ErrorModelConfig(StrictModel):
    """How true memory differs from the estimate (the physical model draws it).

    True resident = estimate x lognormal(``resident_bias``, ``resident_sigma``).
    True request peak = estimate x lognormal(``request_bias``, ``request_sigma``), and
    with probability ``tail_probability`` a further x ``tail_factor`` (a fat tail:
    fragmentation, an unusual input).
    """

    enabled: bool = True
    resident_bias: float = Field(1.0, gt=0)
    resident_sigma: float = Field(0.03, ge=0, le=2)
    request_bias: float = Field(1.0, gt=0)
    request_sigma: float = Field(0.15, ge=0, le=2)
    tail_probability: float = Field(0.02, ge=0, le=1)
    tail_factor: float = Field(1.6, ge=1)


class CapabilitiesConfig(StrictModel):
    """What a simulated service's backend declares it can do (the simulator's default
    backend: a live resize and measured peaks, nothing else). A scenario exported from
    a daemon's history names what that daemon's backends declared."""

    resize: ResizeSupport = ResizeSupport.LIVE
    pause: bool = False
    park: bool = False
    sleep: bool = False
    host_cache: bool = False
    request_peaks: bool = True
    park_on_disk: bool = False
    kv_per_slot: bool = False

    def to_capabilities(self) -> Capabilities:
        return Capabilities(**self.model_dump())


class ServicePerfConfig(StrictModel):
    """Service-time model of one service (solo, on an otherwise idle device).

    LLMs: ``base_s`` + prompt tokens / ``prefill_tps`` until the first token, then
    ``tbt_s`` per output token. Others: ``base_s`` + ``per_unit_s`` x units.
    ``share``: the fraction of the device's compute one request uses alone; running
    requests slow each other when their shares add up beyond 1 (processor sharing).
    """

    share: float = Field(
        0.5,
        gt=0,
        le=8,
        description="The fraction of the device one request uses alone; above 1: it keeps "
        "more threads runnable than the device has cores (measured on a CPU).",
    )
    base_s: float = Field(0.0, ge=0)
    per_unit_s: float = Field(0.0, ge=0)
    prefill_tps: float = Field(2000.0, gt=0)
    tbt_s: float = Field(0.02, ge=0)
    caching_allocator: bool = Field(
        False, description="Keeps freed activation memory reserved (PyTorch-style)."
    )
    warm_init_s: float | None = Field(
        None,
        ge=0,
        description="Start-up time of a load whose process is already up: a parked "
        "model reloaded by accelmux's worker, a sleeping server waking (default: the "
        "service's init_s when parked, 0 when sleeping).",
    )
    request_sigma: float | None = Field(None, ge=0, le=2)
    request_bias: float | None = Field(
        None,
        gt=0,
        description="This service's own request bias (true request peak / estimate), in "
        "place of simulation.error.request_bias: one service's estimate wrong, the rest right.",
    )
    resident_bias: float | None = Field(
        None,
        gt=0,
        description="This service's own resident bias (true weights and runtime / "
        "estimate), in place of simulation.error.resident_bias.",
    )
    unpausable_share: float = Field(
        0.0,
        ge=0,
        le=1,
        description="LLMs: the share of requests that name tools, a response format, log "
        "probabilities or n>1, which a backend (llama-server) cannot pause; each request "
        "draws whether it is one, by the seed.",
    )
    # ---- measured on a real daemon (a scenario exported from its history sets these) ----
    capabilities: CapabilitiesConfig | None = Field(
        None, description="What its backend declares (default: the simulator's backend)."
    )
    weights_key: str | None = Field(
        None,
        description="Services with the same key share one loaded copy of their weights (one "
        "inference worker hosting both): counted once, and a load beside a loaded copy "
        "reads nothing (default: every service holds its own).",
    )
    true_weights: Bytes | None = Field(
        None, description="Measured resident weights (default: the estimate, drawn around)."
    )
    true_runtime: Bytes | None = Field(
        None, description="Measured resident runtime (default: the estimate, drawn around)."
    )
    load_s: float | None = Field(
        None,
        ge=0,
        description="Measured time of a load that reads its weights (default: weights / "
        "the device's load bandwidth + init_s).",
    )
    shared_load_s: float | None = Field(
        None, ge=0, description="Measured time of a load beside a loaded shared copy."
    )
    weight: float | None = Field(
        None,
        ge=0,
        le=16,
        description="How much one running request of it slows the others on its device, "
        "in shares (measured: threads contending for one process's interpreter lock slow "
        "each other beyond their CPU shares); default: its share.",
    )
    executor: str | None = Field(
        None,
        description="Services naming the same executor run their requests one at a time, "
        "in the order they were dispatched (accelmux's inference worker runs each loaded "
        "model on one thread of its own, shared by the services that share the model); "
        "default: each request runs as soon as it is dispatched.",
    )
    load_share: float | None = Field(
        None,
        gt=0,
        le=1,
        description="A load computes on the device with this share (slowed by what runs "
        "beside it, and slowing it), its time being solo work (default: a load takes no "
        "compute and its time is wall time).",
    )


class ForeignConfig(StrictModel):
    """A process accelmux does not manage (a game, a browser, a CUDA app) using the
    device for a while.

    It takes its ``bytes`` when it starts, whatever the Manager thinks
    (``allocates: regardless``, the default: a real program allocates what it needs
    without asking anyone): the device's true free memory falls, over-committing it
    when the managed services hold too much, and every managed allocation that no longer
    fits OOMs until enough is freed; the program is short of what the device cannot hold
    until then. ``allocates: free-only`` is the older, kinder model: it takes only what is
    free when it starts and never asks again (the rest is refused for its whole life).
    While it runs it uses ``compute_share`` of the device's compute, slowing the managed
    requests there (processor sharing, :mod:`accelmux.sim.compute`).

    ``baseline``: memory the device uses on its own (the OS on a shared-memory host),
    reported as the sample's ``baseline_bytes`` rather than as foreign. As the monitors
    do, the sample's baseline is at least what the operator left outside the budget
    (``capacity - budget``): foreign memory within that slack is not pressure.
    """

    device: str | None = None
    baseline: bool = False
    name: str = "foreign"
    at_s: float = Field(ge=0)
    bytes: ByteSize = Field(gt=0)
    duration_s: float | None = Field(None, gt=0)
    compute_share: float = Field(
        0.0,
        ge=0,
        le=1,
        description="The fraction of the device's compute the process uses while it runs.",
    )
    allocates: Literal["regardless", "free-only"] = Field(
        "regardless",
        description="regardless: takes all its bytes at start, over-committing the device "
        "(managed allocations OOM until room is made); free-only: takes only what is free "
        "at start and never retries.",
    )


class SimulationConfig(StrictModel):
    duration_s: float = Field(3600.0, gt=0, le=7 * 86_400)
    start: str = Field(
        "00:00", description='Local time of day at t=0, "HH:MM" (or "HH:MM:SS.fff").'
    )
    seeds: int = Field(5, ge=1, le=1000)
    sample_period_s: float = Field(1.0, gt=0)
    warmup_s: float = Field(
        60.0, ge=0, description="Requests arriving earlier are served but not measured."
    )
    unload_s: float = Field(0.5, ge=0)
    resize_s: float = Field(
        0.05,
        ge=0,
        le=60,
        description="Time a live KV pool resize takes before the backend confirms it.",
    )
    page_cache: Bytes = Field(
        ByteSize(0),
        description="Host RAM the page cache may fill with model files, for every policy: "
        "a load of weights still there (or parked, or sleeping) reads them at the "
        "device's host_bandwidth instead of its load_bandwidth.",
    )
    switch_s: float = Field(
        0.005,
        ge=0,
        le=10,
        description="Time a pause or a resume of a running request takes (a parked "
        "one's KV state also moves at host_bandwidth).",
    )
    error: ErrorModelConfig = Field(default_factory=ErrorModelConfig)
    degrade_cost: DegradeCostConfig = Field(
        default_factory=DegradeCostConfig,
        description="The layer-split cost model of a service's lesser forms (on the CPU, "
        "fewer layers on the GPU): accelmux.sim.degrade_cost.",
    )
    shrink_cost: ShrinkCostConfig = Field(
        default_factory=ShrinkCostConfig,
        description="The micro-batch cost model of a service running a smaller batch "
        "(shrink:): accelmux.sim.shrink_cost.",
    )
    services: dict[str, ServicePerfConfig] = Field(default_factory=dict)
    foreign: list[ForeignConfig] = Field(default_factory=list)
    timeline: str | None = Field(
        None,
        description="A device timeline (CSV, accelmux.sim.recorded): the memory other "
        "programs used and the compute they took, over time, replayed as measured.",
    )
    device_sweep_gib: list[Annotated[float, Field(gt=0)]] = Field(default_factory=list)
    sweep_seeds: int = Field(2, ge=1, le=1000)
    slo_target: float = Field(0.99, gt=0, le=1)

    @field_validator("start")
    @classmethod
    def _check_start(cls, value: str) -> str:
        parse_clock(value)
        return value


class _Workload(StrictModel):
    name: str | None = None
    from_s: float = Field(0.0, ge=0, description="Active from this simulated second.")
    until_s: float | None = Field(None, gt=0, description="Active until this second.")


class PoissonWorkload(_Workload):
    type: Literal["poisson"]
    service: str
    rate_per_h: float = Field(gt=0)
    units: Dist = 0.0
    prompt_tokens: Dist = 0.0
    output_tokens: Dist = 0.0


class GammaWorkload(_Workload):
    type: Literal["gamma"]
    service: str
    rate_per_h: float = Field(gt=0)
    cv: float = Field(1.0, gt=0, le=20)
    units: Dist = 0.0
    prompt_tokens: Dist = 0.0
    output_tokens: Dist = 0.0


class TraceWorkload(_Workload):
    type: Literal["trace"]
    service: str
    path: str = DEFAULT_TRACE
    rate_per_h: float = Field(gt=0, description="Mean home rate the trace is scaled to.")
    max_context_tokens: int | None = Field(None, gt=0)


class VoiceWorkload(_Workload):
    type: Literal["voice"]
    asr: str
    llm: str
    tts: str
    rate_per_h: float = Field(gt=0)
    cv: float = Field(1.0, gt=0, le=20)
    audio_s: Dist = 4.0
    prompt_tokens: Dist = 1500.0
    output_tokens: Dist = 40.0
    chars_per_token: float = Field(4.0, gt=0)
    slo_s: float = Field(3.0, gt=0, description="End-to-end: utterance to spoken answer.")


class IndexingWorkload(_Workload):
    type: Literal["indexing"]
    service: str
    documents: int = Field(gt=0)
    outstanding: int = Field(4, ge=1)
    units: Dist = 16.0
    at: str | None = Field(None, description='Start at this local time "HH:MM".')
    retry_s: float = Field(5.0, gt=0)
    max_attempts: int = Field(5, ge=1, description="A document is skipped after this many.")

    @field_validator("at")
    @classmethod
    def _check_at(cls, value: str | None) -> str | None:
        if value is not None:
            parse_clock(value)
        return value


class CameraWorkload(_Workload):
    type: Literal["camera"]
    service: str
    cameras: int = Field(1, ge=1)
    fps: float = Field(gt=0, le=120)
    units: Dist = 0.41


class RecordedWorkload(_Workload):
    """The requests a daemon recorded (``accelmux history export``), replayed: each at
    its time, a request that followed an earlier one of the same client that long after
    it ends here (:mod:`accelmux.sim.recorded`)."""

    type: Literal["recorded"]
    path: str
    drop_services: list[str] = Field(
        default_factory=list, description="Services whose requests are left out."
    )
    closed_loop: bool = Field(
        True,
        description="Send a linked request when its predecessor ends here (false: at its "
        "recorded time, whatever happens).",
    )


WorkloadConfig = Annotated[
    PoissonWorkload
    | GammaWorkload
    | TraceWorkload
    | VoiceWorkload
    | IndexingWorkload
    | CameraWorkload
    | RecordedWorkload,
    Field(discriminator="type"),
]


class ScenarioConfig(AccelmuxConfig):
    """A config plus the simulated world around it."""

    workloads: list[WorkloadConfig] = Field(min_length=1)
    simulation: SimulationConfig = Field(default_factory=SimulationConfig)
    #: A scenario may also set the configurable baselines' knobs (``policy.ollama``,
    #: ``policy.llama_swap``); the daemon's config runs a baseline at its defaults.
    policy: BaselinePolicyConfig = Field(
        default_factory=BaselinePolicyConfig, description="Policy knobs, baselines' too."
    )


def workload_services(w: WorkloadConfig) -> list[str]:
    """The services a workload names in the scenario (a recorded one names its services
    in its file: see :func:`recorded_problems`)."""
    if isinstance(w, VoiceWorkload):
        return [w.asr, w.llm, w.tts]
    if isinstance(w, RecordedWorkload):
        return []
    return [w.service]


@dataclass(frozen=True)
class Scenario:
    """A validated scenario and where it came from."""

    config: ScenarioConfig
    source: str
    base_dir: Path

    @property
    def name(self) -> str:
        return Path(self.source).stem

    @property
    def start_s_of_day(self) -> float:
        return parse_clock(self.config.simulation.start)

    def capacity_gib(self) -> float:
        dev = next(iter(self.config.devices.values()))
        return int(dev.capacity or 0) / GIB

    def manager_spec(self, capacity_gib: float | None = None) -> ManagerSpec:
        """The Manager's spec; ``capacity_gib`` resizes every device (sweeps).

        The budget keeps the same distance below capacity as configured (a host keeps
        its OS share).
        """
        spec = to_manager_spec(
            self.config,
            clock_origin_s_of_day=self.start_s_of_day,
            host_budget=int(self.config.simulation.page_cache),
        )
        # A scenario's services each hold the memory their section describes: the
        # simulated device keeps no copy of weights shared between two of them.
        # A service a camera workload feeds runs a steady stream of frames (unless its
        # section says ``steady: false``): batch work may not take it (the background floor).
        fed = {w.service for w in self.config.workloads if isinstance(w, CameraWorkload)}

        def steady(s: ServiceSpec) -> bool:
            own = self.config.services[s.group or s.name].steady
            return own if own is not None else s.steady or (s.group or s.name) in fed

        # Unless the scenario says how they share (a daemon's history does: one worker
        # hosting both), a scenario's services each hold their own copy.
        perf = self.config.simulation.services

        def measured(s: ServiceSpec) -> ServiceSpec:
            own = perf.get(s.addressed_as)
            caps = own.capabilities if own is not None else None
            return dataclasses.replace(
                s,
                weights_key=(own.weights_key or "") if own is not None else "",
                steady=steady(s),
                capabilities=caps.to_capabilities() if caps is not None else s.capabilities,
            )

        spec = dataclasses.replace(spec, services=tuple(measured(s) for s in spec.services))
        if capacity_gib is None:
            return spec
        devices = []
        for dev in spec.devices:
            cap = int(capacity_gib * GIB)
            budget = max(dev.headroom_bytes + 1, cap - (dev.capacity_bytes - dev.budget_bytes))
            devices.append(dataclasses.replace(dev, capacity_bytes=cap, budget_bytes=budget))
        return dataclasses.replace(spec, devices=tuple(devices))

    def resolve(self, path: str) -> Path:
        """A data path: absolute, else relative to the scenario file, else to its parent."""
        p = Path(path).expanduser()
        if p.is_absolute():
            return p
        for base in (self.base_dir, self.base_dir.parent, Path.cwd()):
            candidate = (base / p).resolve()
            if candidate.exists():
                return candidate
        return (self.base_dir / p).resolve()


def scenario_problems(cfg: ScenarioConfig, base: Scenario | None = None) -> list[str]:
    problems = semantic_problems(cfg, base.base_dir if base else None)
    names = set(cfg.services)
    for i, w in enumerate(cfg.workloads):
        for svc in workload_services(w):
            if svc not in names:
                problems.append(f"workloads.{i}: unknown service (got {svc!r})")
        if w.until_s is not None and w.until_s <= w.from_s:
            problems.append(f"workloads.{i}.until_s: must be after from_s (got {w.until_s})")
    sim = cfg.simulation
    for name in sim.services:
        if name not in names:
            problems.append(f"simulation.services.{name}: unknown service (got {name!r})")
    for i, f in enumerate(sim.foreign):
        if f.device is not None and f.device not in cfg.devices:
            problems.append(f"simulation.foreign.{i}.device: unknown device (got {f.device!r})")
    return problems


def recorded_problems(scn: Scenario) -> list[str]:
    """What is wrong with the scenario's recorded workloads and device timeline: a file
    that cannot be read, a request for a service the scenario does not have."""
    out: list[str] = []
    names = set(scn.config.services)
    for i, w in enumerate(scn.config.workloads):
        if not isinstance(w, RecordedWorkload):
            continue
        try:
            rows = read_trace(scn.resolve(w.path))
        except RecordedError as exc:
            out.append(f"workloads.{i}.path: {exc}")
            continue
        unknown = sorted({r.service for r in rows} - names - set(w.drop_services))
        if unknown:
            out.append(
                f"workloads.{i}: the trace names service(s) the scenario does not have: "
                f"{', '.join(unknown)} (add them, or list them in drop_services)"
            )
    timeline = scn.config.simulation.timeline
    if timeline is not None:
        try:
            devices = {r.device for r in read_timeline(scn.resolve(timeline))}
        except RecordedError as exc:
            out.append(f"simulation.timeline: {exc}")
        else:
            for dev in sorted(devices - set(scn.config.devices)):
                out.append(f"simulation.timeline: unknown device {dev!r} in {timeline}")
    return out


def trace_problems(scn: Scenario, trace_override: str | None = None) -> list[str]:
    out = recorded_problems(scn)
    for i, w in enumerate(scn.config.workloads):
        if isinstance(w, TraceWorkload):
            path = Path(trace_override) if trace_override else scn.resolve(w.path)
            if not path.is_file():
                out.append(
                    f"workloads.{i}.path: trace file not found (got {str(path)!r}); "
                    "pass --trace PATH"
                )
    return out


def load_scenario_data(data: object, source: str, base_dir: Path) -> Scenario:
    if not isinstance(data, dict):
        raise ConfigError(source, [f"(top level): expected a mapping, got {type(data).__name__}"])
    data, notices = modernize(data)
    try:
        cfg = ScenarioConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, format_validation_error(exc)) from None
    scn = Scenario(config=cfg, source=source, base_dir=base_dir)
    problems = scenario_problems(cfg, scn)
    if problems:
        raise ConfigError(source, problems)
    cfg.note_deprecations(notices)
    return scn


def load_scenario(path: str | Path) -> Scenario:
    p = Path(path)
    return load_scenario_data(parse_yaml(read_text(p), str(p)), str(p), p.parent.resolve())


def is_scenario_data(data: object) -> bool:
    return isinstance(data, dict) and "workloads" in data
