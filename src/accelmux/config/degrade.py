"""A service's ``degrade:`` section: what is wrong with it, and the forms it gives the
Manager (:mod:`accelmux.core.degrade`).

Each form is a replica of the service's group: the full form on its GPU, one form per
offload level (fewer layers on the GPU: the weights of the layers llama.cpp offloads,
from the GGUF's per-layer sizes when ``memory.gguf`` is set, else an even share per
layer), and the form on the fallback host device (the whole model in host RAM).
"""

from __future__ import annotations

import dataclasses

from accelmux.config.backends import (
    ExternalBackendConfig,
    FakeBackendConfig,
    WorkerBackendConfig,
)
from accelmux.config.schema import AccelmuxConfig, DegradeConfig, ServiceConfig
from accelmux.core.degrade import (
    Variant,
    VariantMode,
    layer_split_slowdown,
    offload_levels,
    variant_name,
)
from accelmux.core.specs import MemoryProfile, ServiceSpec
from accelmux.core.types import Residency
from accelmux.errors import BackendError
from accelmux.models.gguf_layers import gguf_layers

#: Backends whose forms the daemon can run: the inference worker (llama.cpp's
#: ``n_gpu_layers`` per form, the CPU on a host device) and the fake test double.
_LAYER_BACKENDS = (WorkerBackendConfig, FakeBackendConfig)


def degrade_problems(cfg: AccelmuxConfig) -> list[str]:
    """Why a ``degrade:`` section cannot be honoured (each names its key)."""
    problems: list[str] = []
    for name, svc in cfg.services.items():
        d = svc.degrade
        if d is None:
            continue
        key = f"services.{name}.degrade"
        if svc.device is None:
            problems.append(
                f"services.{name}.device: a service that degrades runs on one GPU; "
                f"name it with device: (got {'devices' if svc.devices else 'none'})"
            )
            continue
        if svc.device not in cfg.devices:
            continue  # named by the device check
        if cfg.devices[svc.device].kind == "host":
            problems.append(
                f"{key}: its device {svc.device!r} is the host already: only a service on a "
                "GPU (kind nvidia or virtual) degrades"
            )
        if svc.residency is Residency.PINNED:
            problems.append(f"{key}: a pinned service never leaves its device (got pinned)")
        if isinstance(svc.backend, ExternalBackendConfig):
            problems.append(
                f"{key}: an external server's device and layers are its own command line; "
                "degrading needs backend type worker (or fake)"
            )
        if d.fallback_device is not None:
            fallback = cfg.devices.get(d.fallback_device)
            if fallback is None:
                problems.append(
                    f"{key}.fallback_device: unknown device (got {d.fallback_device!r})"
                )
            elif fallback.kind != "host" or d.fallback_device == svc.device:
                problems.append(
                    f"{key}.fallback_device: must be a host device other than the service's "
                    f"(got {d.fallback_device!r}, kind {fallback.kind})"
                )
        if d.offload:
            problems += _offload_problems(key, name, svc, d)
    return problems


def _offload_problems(key: str, name: str, svc: ServiceConfig, d: DegradeConfig) -> list[str]:
    if not svc.kind.is_llm:
        return [f"{key}.min_gpu_layers: a layer range is for llama.cpp LLMs (got kind {svc.kind})"]
    if svc.backend is not None and not isinstance(svc.backend, _LAYER_BACKENDS):
        return [f"{key}.min_gpu_layers: this backend cannot choose its layers"]
    try:
        total = model_layers(svc, d)
    except BackendError as exc:
        return [f"services.{name}.memory.gguf: {exc}"]
    if total is None:
        return [f"{key}.layers: required for a layer range without memory.gguf (got none)"]
    most = d.max_gpu_layers or 0
    if most >= total:
        return [
            f"{key}.max_gpu_layers: a partial offload keeps fewer than all {total} layers "
            f"on the GPU (got {most})"
        ]
    return []


def model_layers(svc: ServiceConfig, d: DegradeConfig) -> int | None:
    """The model's layers as llama.cpp counts them: ``layers``, else the GGUF's blocks
    and its output layer."""
    if d.layers is not None:
        return d.layers
    if svc.memory.gguf:
        return len(gguf_layers(svc.memory.gguf).blocks) + 1
    return None


def _gpu_share(svc: ServiceConfig, d: DegradeConfig, n_gpu_layers: int, total: int) -> float:
    """The share of the layer bytes ``n_gpu_layers`` puts on the GPU: the output layer
    and the last blocks, sized from the GGUF when there is one, else even."""
    if svc.memory.gguf and d.layers is None:
        layers = gguf_layers(svc.memory.gguf)
        whole = sum(layers.blocks) + layers.output_bytes
        blocks = (
            layers.blocks[len(layers.blocks) - (n_gpu_layers - 1) :] if n_gpu_layers > 1 else ()
        )
        return (layers.output_bytes + sum(blocks)) / whole if whole else n_gpu_layers / total
    return n_gpu_layers / total


def _offloaded(profile: MemoryProfile, share: float, kv_share: float) -> MemoryProfile:
    """What a partial offload holds on the GPU: its share of the weights and of the KV
    cache (each offloaded block keeps its own); the compute buffers stay whole."""
    return dataclasses.replace(
        profile,
        weights=round(profile.weights * share),
        kv_bytes_per_token=round(profile.kv_bytes_per_token * kv_share),
        kv_floor=round(profile.kv_floor * kv_share),
        kv_ceiling=round(profile.kv_ceiling * kv_share),
    )


def degrade_forms(spec: ServiceSpec, svc: ServiceConfig) -> list[ServiceSpec]:
    """The forms of ``spec`` (the service as its config gives it, on its GPU), best
    first: the full form, the offload levels (most layers first), the CPU form."""
    d = svc.degrade
    assert d is not None
    group = spec.name
    forms = [
        dataclasses.replace(
            spec,
            name=variant_name(group, spec.device, VariantMode.FULL, -1),
            group=group,
            variant=Variant(
                rank=0, mode=VariantMode.FULL, n_gpu_layers=-1, gpu_share=1.0, slowdown=1.0
            ),
        )
    ]
    if d.offload:
        total = model_layers(svc, d)
        assert total is not None and d.min_gpu_layers is not None and d.max_gpu_layers
        for layers in offload_levels(d.min_gpu_layers, d.max_gpu_layers):
            share = _gpu_share(svc, d, layers, total)
            forms.append(
                dataclasses.replace(
                    spec,
                    name=variant_name(group, spec.device, VariantMode.OFFLOAD, layers),
                    group=group,
                    profile=_offloaded(spec.profile, share, (layers - 1) / (total - 1)),
                    weights_key="",
                    variant=Variant(
                        rank=len(forms),
                        mode=VariantMode.OFFLOAD,
                        n_gpu_layers=layers,
                        gpu_share=share,
                        slowdown=layer_split_slowdown(share, d.cpu_slowdown),
                    ),
                )
            )
    if d.fallback_device is not None:
        forms.append(
            dataclasses.replace(
                spec,
                name=variant_name(group, d.fallback_device, VariantMode.CPU, 0),
                group=group,
                device=d.fallback_device,
                weights_key="",
                variant=Variant(
                    rank=len(forms),
                    mode=VariantMode.CPU,
                    n_gpu_layers=0,
                    gpu_share=0.0,
                    slowdown=d.cpu_slowdown,
                ),
            )
        )
    return forms
