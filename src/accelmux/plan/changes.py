"""What a plan changes in a scenario: one :class:`Change` per question a user asks.

Each change edits the scenario's data (the config plus ``simulation`` and
``workloads``) and nothing else; a plan replays the edited scenario beside the one as
recorded. A change keeps every measured speed as it was unless it says otherwise
(``compute_scale``): a bigger device holds more, it is not assumed faster.

- ``device_gib``: the device's capacity in GiB, its budget in the same proportion of
  it as before (a card: all of it; a host: what accelmux took of the RAM);
- ``budget_gib``: the device's budget alone (its headroom: an eighth of it, at least
  256 MiB, as the default stack chooses);
- ``add_device``: a second device of that many GiB, like the first (the same kind,
  speeds and headroom); the policy places the services (``devices`` left open);
- ``compute_scale``: every service's speed on the device times this;
- ``add_service``: a service from a GGUF file's metadata (its memory read from the
  header, as ``memory.gguf`` does) or from a catalogue entry
  (:mod:`accelmux.sim.catalogue`), with a Poisson workload of its own; its speed is the
  measured speed of the history's closest LLM, scaled by the ratio of the weights
  (decode reads every weight per token; prefill computes over them), unless given;
- ``remove_service``: a service and its recorded requests gone;
- ``set``: a field of a service (``class``, ``residency``, ``ttl_s``, ``windows``,
  ``concurrency``, ``queue.limit``, ...) or a policy knob (``policy.spare_fraction``), as
  the config spells it;
- ``policy``: the policy to replay with (any the simulator knows, variants included).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from accelmux.core.types import GIB, MIB
from accelmux.errors import AccelmuxError
from accelmux.models.gguf_profile import gguf_profile
from accelmux.sim import catalogue


class ChangeError(AccelmuxError):
    """A change a plan cannot make (it names what is wrong)."""


LLM_KINDS = ("chat", "completion")


@dataclass(frozen=True, slots=True)
class NewService:
    """A service to add: ``gguf`` (a file) or ``catalogue`` (an entry's name)."""

    name: str
    kind: str = "chat"
    gguf: str | None = None
    catalogue: str | None = None
    cls: str = "interactive"
    residency: str = "warm"
    rate_per_h: float = 20.0
    prompt_tokens: float = 1000.0
    output_tokens: float = 200.0
    ttl_s: float = 600.0
    perf: dict[str, float] = field(default_factory=dict)

    @staticmethod
    def parse(text: str) -> NewService:
        """``name=coder,gguf=/models/coder.gguf,class=interactive,rate_per_h=30``."""
        values: dict[str, str] = {}
        for part in text.split(","):
            if not part.strip():
                continue
            key, sep, value = part.partition("=")
            if not sep:
                raise ChangeError(f"--add-service: {part!r} is not KEY=VALUE")
            values[key.strip()] = value.strip()
        name = values.pop("name", "")
        if not name:
            raise ChangeError("--add-service needs name=NAME")
        kwargs: dict[str, Any] = {"name": name}
        perf: dict[str, float] = {}
        numbers = ("rate_per_h", "prompt_tokens", "output_tokens", "ttl_s")
        speeds = ("tbt_s", "prefill_tps", "base_s", "per_unit_s", "share", "load_s")
        for key, value in values.items():
            try:
                if key in numbers:
                    kwargs[key] = float(value)
                elif key in speeds:
                    perf[key] = float(value)
                elif key in ("kind", "gguf", "catalogue", "residency"):
                    kwargs[key] = value
                elif key == "class":
                    kwargs["cls"] = value
                else:
                    raise ChangeError(
                        f"--add-service: unknown key {key!r} (name, gguf, catalogue, kind, "
                        f"class, residency, {', '.join(numbers + speeds)})"
                    )
            except ValueError:
                raise ChangeError(
                    f"--add-service: {key} must be a number (got {value!r})"
                ) from None
        if ("gguf" in kwargs) == ("catalogue" in kwargs):
            raise ChangeError("--add-service needs exactly one of gguf=FILE and catalogue=NAME")
        return NewService(**kwargs, perf=perf)


@dataclass(frozen=True, slots=True)
class Change:
    """One variant to replay (fields left at None change nothing)."""

    label: str = ""
    device_gib: float | None = None
    budget_gib: float | None = None
    add_device_gib: float | None = None
    compute_scale: float | None = None
    add_services: tuple[NewService, ...] = ()
    remove_services: tuple[str, ...] = ()
    sets: tuple[tuple[str, str], ...] = ()
    policy: str | None = None

    def describe(self) -> str:
        if self.label:
            return self.label
        parts: list[str] = []
        if self.device_gib is not None:
            parts.append(f"{self.device_gib:g} GiB device")
        if self.budget_gib is not None:
            parts.append(f"budget {self.budget_gib:g} GiB")
        if self.add_device_gib is not None:
            parts.append(f"+ {self.add_device_gib:g} GiB device")
        if self.compute_scale is not None:
            parts.append(f"compute x{self.compute_scale:g}")
        parts += [f"+ {s.name}" for s in self.add_services]
        parts += [f"- {name}" for name in self.remove_services]
        parts += [f"{k}={v}" for k, v in self.sets]
        if self.policy:
            parts.append(f"policy {self.policy}")
        return ", ".join(parts) or "as recorded"

    def apply(self, data: dict[str, Any], base_dir: Path) -> tuple[dict[str, Any], list[str]]:
        """The scenario data with this change made (``data`` is left as it was), and
        notes on what was assumed."""
        out = copy.deepcopy(data)
        notes: list[str] = []
        dev_name = next(iter(out["devices"]))
        if self.device_gib is not None:
            _resize(out["devices"][dev_name], self.device_gib)
        if self.budget_gib is not None:
            _budget(out["devices"][dev_name], self.budget_gib)
        if self.add_device_gib is not None:
            _second_device(out, dev_name, self.add_device_gib)
        if self.compute_scale is not None:
            _scale(out, self.compute_scale)
        for name in self.remove_services:
            remove_service(out, name)
        for svc in self.add_services:
            notes.append(_add(out, svc, dev_name, base_dir))
        for key, value in self.sets:
            _set(out, key, value)
        if self.policy:
            out.setdefault("policy", {})["name"] = self.policy
        return out, notes


def _gib(n: float) -> int:
    if n <= 0:
        raise ChangeError(f"a device size must be positive (got {n:g} GiB)")
    return int(n * GIB)


def _resize(dev: dict[str, Any], gib: float) -> None:
    cap = _gib(gib)
    ratio = int(dev["budget"]) / int(dev["capacity"])
    dev["capacity"] = cap
    dev["budget"] = max(int(cap * ratio), 1)
    if int(dev["headroom"]) >= dev["budget"]:
        dev["headroom"] = max(0, dev["budget"] // 8)


def _budget(dev: dict[str, Any], gib: float) -> None:
    budget = _gib(gib)
    if budget > int(dev["capacity"]):
        raise ChangeError(
            f"a budget of {gib:g} GiB is more than the device holds "
            f"({int(dev['capacity']) / GIB:.1f} GiB)"
        )
    dev["budget"] = budget
    dev["headroom"] = max(256 * MIB, budget // 8) if budget > 512 * MIB else budget // 8


def _second_device(data: dict[str, Any], first: str, gib: float) -> None:
    dev = copy.deepcopy(data["devices"][first])
    name = f"{first}2"
    _resize(dev, gib)
    if dev.get("kind") == "host":
        dev["kind"] = "virtual"  # one host RAM per machine: the second is an accelerator
    data["devices"][name] = dev


def _scale(data: dict[str, Any], factor: float) -> None:
    if factor <= 0:
        raise ChangeError(f"compute_scale must be positive (got {factor:g})")
    for perf in data.get("simulation", {}).get("services", {}).values():
        for key in ("base_s", "per_unit_s", "tbt_s"):
            if key in perf:
                perf[key] = perf[key] / factor
        if "prefill_tps" in perf:
            perf["prefill_tps"] = perf["prefill_tps"] * factor


def remove_service(data: dict[str, Any], name: str) -> None:
    if name not in data["services"]:
        raise ChangeError(
            f"cannot remove {name!r}: no such service ({', '.join(data['services'])})"
        )
    del data["services"][name]
    data.get("simulation", {}).get("services", {}).pop(name, None)
    kept = []
    for w in data["workloads"]:
        if w.get("type") == "recorded":
            w.setdefault("drop_services", []).append(name)
        elif name in (w.get("service"), w.get("asr"), w.get("llm"), w.get("tts")):
            continue
        kept.append(w)
    data["workloads"] = kept


def _set(data: dict[str, Any], key: str, value: str) -> None:
    service, _, path = key.partition(".")
    if (service != "policy" and service not in data["services"]) or not path:
        raise ChangeError(
            f"--set {key}={value}: expected SERVICE.FIELD=VALUE with a known service "
            f"({', '.join(data['services'])}) or policy.KNOB=VALUE"
        )
    parsed: Any = yaml.safe_load(value) if value else value
    if path == "windows" and isinstance(parsed, str):
        parsed = [w.strip() for w in parsed.split(",") if w.strip()]
    target = data.setdefault("policy", {}) if service == "policy" else data["services"][service]
    parts = path.split(".")
    for part in parts[:-1]:
        target = target.setdefault(part, {})
    target[parts[-1]] = parsed


def _reference_llm(data: dict[str, Any]) -> tuple[str, dict[str, Any], int] | None:
    """The measured LLM a new one's speed is scaled from: the largest with a speed."""
    perf = data.get("simulation", {}).get("services", {})
    best: tuple[str, dict[str, Any], int] | None = None
    for name, svc in data["services"].items():
        if svc.get("kind") not in LLM_KINDS or "tbt_s" not in perf.get(name, {}):
            continue
        weights = int(svc.get("memory", {}).get("weights", 0))
        if best is None or weights > best[2]:
            best = (name, perf[name], weights)
    return best


def _new_memory(
    svc: NewService, data: dict[str, Any], dev_name: str, base_dir: Path
) -> dict[str, Any]:
    if svc.gguf is not None:
        path = Path(svc.gguf).expanduser()
        path = path if path.is_absolute() else (base_dir / path).resolve()
        profile = gguf_profile(path)  # BackendError names the file and what is wrong
        ctx = 4096
        return {
            "weights": profile.weights_bytes,
            "runtime": 64 * MIB + profile.n_vocab * 224,
            "kv_per_token": profile.kv_bytes_per_token,
            "kv_floor": profile.kv_bytes_per_token * 512,
            "kv_ceiling": profile.kv_bytes_per_token * ctx,
            "workspace": 16 * MIB,
        }
    assert svc.catalogue is not None
    names = [m.name for m in catalogue.LLMS] + [m.name for m in catalogue.MODELS]
    if svc.catalogue not in names:
        raise ChangeError(f"no catalogue entry {svc.catalogue!r} (entries: {', '.join(names)})")
    host = data["devices"][dev_name].get("kind") == "host"
    context = 150 * MIB if host else 300 * MIB
    if svc.catalogue in [m.name for m in catalogue.LLMS]:
        m = catalogue.llm(svc.catalogue)
        return {
            "weights": m.gguf_bytes,
            "runtime": context + m.compute_buffer,
            "kv_per_token": m.kv_per_token,
            "kv_floor": m.kv_per_token * 512,
            "kv_ceiling": m.kv_per_token * 4096,
            "workspace": 32 * MIB,
        }
    model = catalogue.model(svc.catalogue)
    return {
        "weights": model.weights,
        "runtime": context,
        "workspace": model.workspace,
        "per_unit": model.per_unit,
    }


def _new_perf(
    svc: NewService, data: dict[str, Any], memory: dict[str, Any]
) -> tuple[dict[str, Any], str]:
    if svc.kind not in LLM_KINDS:
        if not {"base_s", "per_unit_s"} <= svc.perf.keys():
            raise ChangeError(
                f"--add-service {svc.name}: give its speed (base_s=..., per_unit_s=...); "
                "only an LLM's is scaled from the history"
            )
        return dict(svc.perf), "as given"
    ref = _reference_llm(data)
    if ref is None:
        if not {"tbt_s", "prefill_tps"} <= svc.perf.keys():
            raise ChangeError(
                f"--add-service {svc.name}: the history has no LLM with a measured speed to "
                "scale from; give tbt_s=... and prefill_tps=..."
            )
        return dict(svc.perf), "as given"
    name, perf, weights = ref
    ratio = int(memory["weights"]) / max(1, weights)
    scaled = {
        "share": perf.get("share", 0.5),
        "base_s": perf.get("base_s", 0.0),
        "tbt_s": float(perf["tbt_s"]) * ratio,
        "prefill_tps": float(perf.get("prefill_tps", 2000.0)) / ratio,
        "load_s": float(perf.get("load_s", 1.0)) * ratio,
    }
    scaled.update(svc.perf)
    return scaled, f"scaled from {name}'s measured speed by its weights (x{ratio:.1f})"


def _add(data: dict[str, Any], svc: NewService, dev_name: str, base_dir: Path) -> str:
    if svc.name in data["services"]:
        raise ChangeError(f"cannot add {svc.name!r}: a service of that name exists")
    memory = _new_memory(svc, data, dev_name, base_dir)
    perf, how = _new_perf(svc, data, memory)
    entry: dict[str, Any] = {
        "kind": svc.kind,
        "class": svc.cls,
        "residency": svc.residency,
        "memory": memory,
    }
    if svc.residency != "pinned":
        entry["ttl_s"] = svc.ttl_s
    data["services"][svc.name] = entry
    data.setdefault("simulation", {}).setdefault("services", {})[svc.name] = perf
    workload: dict[str, Any] = {
        "type": "poisson",
        "name": f"added-{svc.name}",
        "service": svc.name,
        "rate_per_h": svc.rate_per_h,
    }
    if svc.kind in LLM_KINDS:
        workload["prompt_tokens"] = {"mean": svc.prompt_tokens, "cv": 0.5}
        workload["output_tokens"] = {"mean": svc.output_tokens, "cv": 0.5}
    else:
        workload["units"] = {"mean": 1.0, "cv": 0.5}
    data["workloads"].append(workload)
    return f"{svc.name}: speed {how}"


def with_label(change: Change, label: str) -> Change:
    return dataclasses.replace(change, label=label)
