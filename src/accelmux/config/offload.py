"""Which worker services of a config will run on the CPU although their device is a GPU,
and which load one model file on several devices.

``accelmux check`` warns about each (the config is still OK): the service, its device,
why its model will run on the CPU and how to fix it (:mod:`accelmux.models.offload`
decides, as the inference worker does when it loads the model). Services of the shared
worker that load the same model on two devices get a copy each, one per device, each
charged to its own device (the worker's component key and the ledger's weights key hold
the device): ``check`` names them, so that nobody expects one shared copy.
"""

from __future__ import annotations

from accelmux.config.backends import WorkerBackendConfig
from accelmux.config.schema import AccelmuxConfig
from accelmux.models.offload import n_gpu_layers_option, placement

#: The component type a worker gives each service kind (``options.model_type`` overrides;
#: kept equal to :func:`accelmux.worker.components.component_type` by a test).
KIND_COMPONENTS = {
    "chat": "llama",
    "completion": "llama",
    "embeddings": "minilm",
    "tts": "piper",
    "asr": "pocketsphinx",
    "detect": "opencv",
    "camera": "opencv",
}


def offload_problems(cfg: AccelmuxConfig) -> list[str]:
    """A worker service's ``options.n_gpu_layers`` that is not an integer of -1 or more."""
    out = []
    for name, svc in cfg.services.items():
        if isinstance(svc.backend, WorkerBackendConfig):
            try:
                n_gpu_layers_option(dict(svc.backend.options))
            except ValueError as exc:
                out.append(f"services.{name}.backend.options: {exc}")
    return out


def offload_warnings(cfg: AccelmuxConfig) -> list[str]:
    """One line per worker service on an nvidia device whose model will run on the CPU."""
    out = []
    for name, svc in cfg.services.items():
        backend = svc.backend
        if not isinstance(backend, WorkerBackendConfig):
            continue
        options = dict(backend.options)
        ctype = str(options.get("model_type") or KIND_COMPONENTS.get(svc.kind.value, ""))
        for device_name in cfg.devices_of(name):
            device = cfg.devices[device_name]
            if device.kind != "nvidia":
                continue
            try:
                where = placement(ctype, options, device.index)
            except ValueError:
                continue  # a problem offload_problems names
            if where.fallback:
                out.append(
                    f"service {name!r} is on nvidia device {device_name!r} but will run on "
                    f"{where.accelerator}; to fix: {where.fix}"
                )
    return out


def shared_model_notes(cfg: AccelmuxConfig) -> list[str]:
    """One line per model that services of the shared worker load on more than one
    device: each device holds (and is charged) a copy of its own."""
    holders: dict[str, list[tuple[str, str]]] = {}
    for name, svc in cfg.services.items():
        backend = svc.backend
        if not isinstance(backend, WorkerBackendConfig) or backend.isolated:
            continue
        for device in cfg.devices_of(name):
            model = backend.weights_key(svc.kind, device).rsplit("@", 1)[0]
            holders.setdefault(model, []).append((name, device))
    out = []
    for model, on in holders.items():
        if len({device for _, device in on}) > 1:
            where = ", ".join(f"{name!r} on {device!r}" for name, device in on)
            out.append(
                f"services {where} load the same model ({model}) on different devices: "
                "each device holds and is charged a copy of its own"
            )
    return out
