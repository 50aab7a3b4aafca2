"""Backend sections of a service's config.

``fake``: a deterministic test double that allocates real memory when told to.
``external``: a supervised OpenAI-compatible server started from an argv list.
``inprocess``: a model hosted in accelmux's shared inference worker.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Backend(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FakeBackendConfig(_Backend):
    type: Literal["fake"]
    latency_s: float = Field(0.01, ge=0, description="Service time per request.")
    allocate: bool = Field(True, description="Allocate real memory for weights and requests.")


class ExternalBackendConfig(_Backend):
    type: Literal["external"]
    argv: list[str] = Field(min_length=1, description="Command as a list; {port} is templated.")
    env: dict[str, str] = Field(default_factory=dict)
    port: int | None = Field(None, ge=1, le=65535)
    health_path: str = "/health"
    startup_timeout_s: float = Field(120.0, gt=0)
    stop_grace_s: float = Field(10.0, ge=0)
    upstream_model: str | None = None


class InProcessBackendConfig(_Backend):
    type: Literal["inprocess"]
    model_path: str | None = None
    isolated: bool = Field(False, description="Run in its own worker process.")
    options: dict[str, str | int | float | bool] = Field(default_factory=dict)


BackendConfig = Annotated[
    FakeBackendConfig | ExternalBackendConfig | InProcessBackendConfig,
    Field(discriminator="type"),
]
