"""What a separate LLM server says about itself: its Prometheus ``/metrics`` and ``/slots``.

llama-server (started with ``--metrics``; ``/slots`` is on by default) exposes
``llamacpp:requests_processing``, ``llamacpp:requests_deferred``,
``llamacpp:n_busy_slots_per_decode`` (requests batched per decode),
``llamacpp:n_tokens_max`` and, in versions that have it, ``llamacpp:kv_cache_usage_ratio``
and ``llamacpp:kv_cache_tokens``; ``/slots`` lists each slot's ``n_ctx`` and whether it
``is_processing``, with ``n_prompt_tokens`` and ``next_token.n_decoded`` while it does.
vLLM's ``/metrics`` has ``vllm:num_requests_running``, ``vllm:num_requests_waiting`` and
``vllm:gpu_cache_usage_perc`` (``vllm:kv_cache_usage_perc`` in newer versions), a
fraction of its KV cache in use. Names a server does not expose are simply absent.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

#: Prometheus names read from a server's /metrics -> the key they are shown under.
SERVER_GAUGES = {
    "llamacpp:requests_processing": "requests_processing",
    "llamacpp:requests_deferred": "requests_waiting",
    "llamacpp:n_busy_slots_per_decode": "busy_slots_per_decode",
    "llamacpp:n_tokens_max": "tokens_max",
    "llamacpp:kv_cache_usage_ratio": "kv_usage_ratio",
    "llamacpp:kv_cache_tokens": "kv_tokens",
    "vllm:num_requests_running": "requests_processing",
    "vllm:num_requests_waiting": "requests_waiting",
    "vllm:gpu_cache_usage_perc": "kv_usage_ratio",
    "vllm:kv_cache_usage_perc": "kv_usage_ratio",
}


def parse_server_metrics(text: str) -> dict[str, float]:
    """The known gauges of a Prometheus text page (summed over label sets)."""
    out: dict[str, float] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError:
        return out
    for family in families:
        for sample in family.samples:
            key = SERVER_GAUGES.get(sample.name)
            if key is not None:
                out[key] = out.get(key, 0.0) + float(sample.value)
    return out


def parse_slots(slots: Any) -> dict[str, int]:
    """Context and slots from llama-server's ``/slots`` answer (a list of slot objects)."""
    if not isinstance(slots, list):
        return {}
    n_ctx = 0
    busy = 0
    in_use = 0
    for slot in slots:
        if not isinstance(slot, dict):
            continue
        n_ctx = max(n_ctx, int(slot.get("n_ctx") or 0))
        if slot.get("is_processing"):
            busy += 1
            decoded = (slot.get("next_token") or {}).get("n_decoded") or 0
            in_use += int(slot.get("n_prompt_tokens") or 0) + int(decoded)
    return {
        "slots": len(slots),
        "slots_processing": busy,
        "context_per_slot": n_ctx,
        "context_in_use_tokens": in_use,
    }


def reported_batch_size(stats: dict[str, Any]) -> int | None:
    """The requests a server computes at once, as it reports them: its slots processing
    (llama-server's ``/slots``), else its requests processing (``/metrics``:
    ``llamacpp:requests_processing``, vLLM's ``num_requests_running``); None when it
    reports neither (no ``slots_path`` nor ``metrics_path``). Never its ``-b`` flag,
    which is a batch of tokens, not of requests."""
    for key in ("slots_processing", "requests_processing"):
        value = stats.get(key)
        if value is not None:
            return int(value)
    return None


def argv_option(argv: list[str], *names: str) -> int | None:
    """The integer value of the first of ``names`` in ``argv`` (``-b 512``,
    ``--batch-size=512``), or None."""
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(name + "="):
                value = arg.split("=", 1)[1]
            else:
                continue
            try:
                return int(value)
            except ValueError:
                return None
    return None
