"""Backend sections of a service's config.

``fake``: a deterministic test double that allocates real memory when told to.
``external``: a supervised OpenAI-compatible server started from an argv list.
``worker``: a model hosted in accelmux's inference worker process (one shared by every
such service, or one of its own with ``isolated: true``). Its old spelling ``inprocess``
is still read (:mod:`accelmux.config.deprecated`).
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ByteSize, ConfigDict, Field

from accelmux.core.specs import Capabilities
from accelmux.core.types import ResizeSupport, ServiceKind

#: The ``{name}`` placeholders an external backend's argv may use.
ARGV_PLACEHOLDERS = (
    "port",
    "host",
    "ctx_size",
    "ctx_total",
    "ctx_per_slot",
    "parallel",
    "kv_pool_bytes",
    "model",
    "gpu",
    "gpu_memory_utilization",
    "memory_limit_bytes",
    "slot_save_path",
)

#: The model family the inference worker loads for each kind (``options.model_type``
#: overrides), and its packaged LLM per LLM kind: with the model file, what makes two
#: services share one loaded copy (:meth:`WorkerBackendConfig.weights_key`; the worker's
#: ``component_key`` decides the same, a test keeps them in step).
WORKER_FAMILIES = {
    ServiceKind.CHAT: "llama",
    ServiceKind.COMPLETION: "llama",
    ServiceKind.EMBEDDINGS: "minilm",
    ServiceKind.TTS: "piper",
    ServiceKind.ASR: "pocketsphinx",
    ServiceKind.DETECT: "opencv",
    ServiceKind.CAMERA: "opencv",
}
PACKAGED_LLMS = {ServiceKind.CHAT: "smollm2", ServiceKind.COMPLETION: "gemma3"}

#: The argv flag vLLM needs for its sleep endpoints (with ``VLLM_SERVER_DEV_MODE=1``).
VLLM_SLEEP_FLAG = "--enable-sleep-mode"


def argv_placeholder_problem(arg: str) -> str | None:
    """Why ``arg`` cannot be templated (an unknown or malformed placeholder), or None."""
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(arg) if name is not None]
    except ValueError as exc:
        return f"malformed placeholder in {arg!r} ({exc}; write {{{{ for a literal brace)"
    for name in fields:
        base = name.split(".")[0].split("[")[0]
        if base not in ARGV_PLACEHOLDERS:
            return (
                f"unknown placeholder {{{name}}} in {arg!r} "
                f"(known: {', '.join('{' + p + '}' for p in ARGV_PLACEHOLDERS)})"
            )
    return None


class _Backend(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def capabilities(self, kind: ServiceKind | None = None) -> Capabilities:
        """What a backend of this section can do (for a service of ``kind``)."""
        raise NotImplementedError


class FakeBackendConfig(_Backend):
    """The fake backend: a test double, no model. Outputs are deterministic per input."""

    type: Literal["fake"]
    latency_s: float = Field(0.01, ge=0, le=3600, description="Service time per request.")
    load_s: float = Field(0.05, ge=0, le=3600, description="Time a load takes.")
    allocate: bool = Field(True, description="Allocate real memory for weights and requests.")
    scale: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Fraction of the ledger's bytes really allocated (keeps demos light); "
        "reports are scaled back up so the ledger sees the configured sizes.",
    )
    peak_factor: float = Field(
        0.8, ge=0, le=4, description="Measured peak of a request as a fraction of its lease."
    )
    embedding_dim: int = Field(64, ge=1, le=8192)
    stream_chunk_s: float = Field(0.0, ge=0, le=60, description="Pause between stream chunks.")
    # ---- fault injection (test-double options; they exist to test accelmux itself) ----
    fail_load: bool = Field(False, description="Test double: make every load fail.")
    hang_load: bool = Field(
        False, description="Test double: a load never finishes (tests the load timeout)."
    )
    request_bytes: ByteSize | None = Field(
        None,
        description="Test double: every request really uses this many bytes, whatever its "
        "lease (a request that needs more than estimated; calibration must catch up).",
    )
    crash_after_requests: int | None = Field(
        None,
        ge=1,
        description="Test double: the backend crashes (drops its memory, fails the requests "
        "in flight, reports a crash) at the end of the service time of this request (the "
        "Nth since start), once.",
    )
    resize: ResizeSupport = Field(
        ResizeSupport.LIVE,
        description="Test double: when it declares it can change its KV pool (live, "
        "next_load or none).",
    )
    resize_s: float = Field(0.0, ge=0, le=3600, description="Time a live resize takes.")
    fail_resize: bool = Field(False, description="Test double: refuse every live resize.")

    def capabilities(self, kind: ServiceKind | None = None) -> Capabilities:
        return Capabilities(resize=self.resize, request_peaks=True)


class ExternalBackendConfig(_Backend):
    """A supervised OpenAI-compatible server (llama-server, vLLM, a whisper/TTS server).

    ``argv`` is templated with ``{port}``, ``{host}``, ``{ctx_total}`` (tokens the whole KV
    pool holds: llama-server's ``--ctx-size``; ``{ctx_size}`` is the same value, its
    older name), ``{parallel}`` (the service's concurrency), ``{ctx_per_slot}``
    (``ctx_total // parallel``: what one of llama-server's ``--parallel`` slots gets, and
    so the longest request it serves), ``{kv_pool_bytes}``, ``{model}``,
    ``{gpu}`` (the device index), ``{memory_limit_bytes}`` (its ledger entry plus
    ``limit_margin``), ``{gpu_memory_utilization}`` (that limit as a fraction of the
    GPU) and ``{slot_save_path}`` (``<data_dir>/slots/<service>``, for llama-server's
    ``--slot-save-path``). It is never run through a shell.
    """

    type: Literal["external"]
    argv: list[str] = Field(min_length=1, description="Command as a list; {port} is templated.")
    env: dict[str, str] = Field(default_factory=dict)
    host: str = Field("127.0.0.1", description="Where the child listens (templated {host}).")
    port: int | None = Field(None, ge=1, le=65535, description="Default: a free port.")
    health_path: str = "/health"
    startup_timeout_s: float = Field(120.0, gt=0)
    stop_grace_s: float = Field(10.0, ge=0)
    request_timeout_s: float = Field(600.0, gt=0)
    upstream_model: str | None = Field(
        None, description="Model name sent upstream (default: the client's)."
    )
    ctx_size: int = Field(
        4096, ge=1, description="{ctx_total} (and {ctx_size}) when the service has no kv_per_token."
    )
    log_lines: int = Field(200, ge=0, le=100_000, description="Log lines kept in memory.")
    memory_limit: bool = Field(
        True,
        description="On a host-memory device, run the server in a cgroup v2 with memory.max "
        "set from its ledger entry where the host allows (status says when it does not).",
    )
    limit_margin: float = Field(
        0.25,
        ge=0,
        le=10,
        description="The limit is the ledger entry (weights, runtime, KV pool, concurrency x "
        "workspace) times 1 + this.",
    )
    metrics_path: str | None = Field(
        None,
        description="The server's Prometheus page, read for status (llama-server with "
        "--metrics, vLLM: /metrics).",
    )
    slots_path: str | None = Field(
        None, description="llama-server's /slots, read for the context in use."
    )
    sleep: Literal["vllm"] | None = Field(
        None,
        description="vllm: the server is vLLM started with --enable-sleep-mode; an unload to "
        "tier sleeping puts it to sleep (POST /sleep?level=1: its weights go to host RAM, "
        "its KV cache is dropped, the process stays) and the next load wakes it (POST "
        "/wake_up) instead of starting it again. accelmux sets VLLM_SERVER_DEV_MODE=1 in its "
        "environment, which those endpoints need.",
    )
    sleep_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Longest a sleep or a wake may take: a server that refuses or does not "
        "answer in time is stopped instead (a cold unload, or a cold start for a wake).",
    )
    park: Literal["llama-server"] | None = Field(
        None,
        description="llama-server: streamed completions (and chat without tools) can be "
        "paused between tokens and their KV parked with the server's slot save and restore. "
        "The argv must pass --slot-save-path {slot_save_path} (a directory accelmux keeps "
        "under its data dir).",
    )

    def capabilities(self, kind: ServiceKind | None = None) -> Capabilities:
        """A running server's context is fixed: a KV pool templated into its argv
        (``{ctx_size}``, ``{kv_pool_bytes}``) changes at its next start, otherwise never.
        Each request's peak is measured from outside (its process tree). ``sleep: vllm``
        declares sleep; ``park: llama-server`` declares pause and park."""
        sized = any(
            f"{{{name}}}" in arg
            for arg in self.argv
            for name in ("ctx_size", "ctx_total", "ctx_per_slot", "kv_pool_bytes")
        )
        resize = ResizeSupport.NEXT_LOAD if sized else ResizeSupport.NONE
        parks = self.park == "llama-server"
        return Capabilities(
            resize=resize,
            pause=parks,
            park=parks,
            sleep=self.sleep == "vllm",
            request_peaks=True,
            park_on_disk=parks,  # slot files under the data dir, not host RAM
            kv_per_slot=self.splits_context_per_slot(),
        )

    def splits_context_per_slot(self) -> bool:
        """llama-server splits ``--ctx-size`` evenly between its ``--parallel`` (``-np``)
        slots: a request gets one slot's share. True when argv passes ``{parallel}`` to
        one of those flags."""
        for flag, value in zip(self.argv, self.argv[1:], strict=False):
            if flag in ("--parallel", "-np") and "{parallel}" in value:
                return True
        return any(
            arg.startswith(("--parallel=", "-np=")) and "{parallel}" in arg for arg in self.argv
        )


def external_problems(cfg: ExternalBackendConfig, kind: ServiceKind) -> list[str]:
    """What an external section asks that its argv (or its service's kind) cannot give,
    as ``key: why`` lines for the config loader."""
    problems = []
    if cfg.sleep == "vllm" and VLLM_SLEEP_FLAG not in cfg.argv:
        problems.append(f"sleep: vllm needs {VLLM_SLEEP_FLAG} in argv (got none)")
    if cfg.park == "llama-server":
        if not kind.is_llm:
            problems.append(f"park: llama-server is for LLM services (got kind {kind.value})")
        if not any("{slot_save_path}" in arg for arg in cfg.argv):
            problems.append(
                "park: llama-server needs --slot-save-path {slot_save_path} in argv "
                "(the directory accelmux keeps the saved slots in; got none)"
            )
    return problems


class WorkerBackendConfig(_Backend):
    """A real model in accelmux's inference worker process, never in the daemon's own.

    The packaged models, or the file at ``model_path``; services naming the same model
    file share one loaded copy. Old spelling: ``type: inprocess``."""

    type: Literal["worker"]
    model_path: str | None = None
    isolated: bool = Field(False, description="Run in its own worker process.")
    options: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description="Model options (`model`, `n_ctx`, `n_threads`, `model_type`). "
        "`n_gpu_layers`: llama.cpp layers on the GPU when the service's device is "
        "`nvidia` (default -1: all; 0: the CPU; ignored on other devices). See docs/gpu.md.",
    )

    def weights_key(self, kind: ServiceKind, device: str) -> str:
        """What makes services share one loaded copy of a model in the shared worker (the
        worker's ``component_key``: the model family, its file and the device it runs
        on); "" when isolated. Services on two devices never share a copy: each device
        holds (and is charged) its own."""
        if self.isolated:
            return ""
        family = str(self.options.get("model_type") or WORKER_FAMILIES.get(kind, kind.value))
        if family == "llama":
            name = self.options.get("model", PACKAGED_LLMS.get(kind, "smollm2"))
            where = str(Path(self.model_path).resolve()) if self.model_path else f"{name}"
        elif self.model_path:
            where = str(Path(self.model_path).resolve())
        else:
            where = "packaged"
        return f"{family}:{where}@{device}"

    def capabilities(self, kind: ServiceKind | None = None) -> Capabilities:
        """A worker-hosted llama.cpp model rebuilds its context on the loaded weights (a
        live resize), pauses a streamed generation between tokens and parks its KV state
        in host RAM, and keeps an unloaded model's GGUF file in host RAM (tier parked);
        every hosted model reports its requests' measured peaks."""
        if kind is not None and kind.is_llm:
            return Capabilities(
                resize=ResizeSupport.LIVE,
                pause=True,
                park=True,
                host_cache=True,
                request_peaks=True,
            )
        return Capabilities(resize=ResizeSupport.NONE, request_peaks=True)


BackendConfig = Annotated[
    FakeBackendConfig | ExternalBackendConfig | WorkerBackendConfig,
    Field(discriminator="type"),
]
