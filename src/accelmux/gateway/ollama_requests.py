"""The Ollama request bodies the gateway takes (``/api/chat``, ``/api/generate``,
``/api/embed``, ``/api/embeddings``, ``/api/show``): one pydantic model each, the one
source of their validation (:mod:`.ollama_api`) and of their schemas in the OpenAPI
document (:mod:`.openapi`).

A request is checked here for what is Ollama's own (``keep_alive``, ``format``,
``options``, images and the fields these models cannot honour), then translated into
its OpenAI twin, which the OpenAI request models check as any other. Fields not declared
are ignored, as Ollama ignores what a model does not know.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal, Self

from pydantic import ConfigDict, Field, PlainValidator, model_validator

from accelmux.gateway.openai_requests import (
    Content,
    EmbeddingsInput,
    ModelName,
    Penalty,
    Stop,
    Temperature,
    Tool,
    TopP,
)
from accelmux.request_validation import JsonInt, RequestModel, field_error, one_error

_DURATION = re.compile(r"(-?\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
#: A ``keep_alive`` string: seconds (``"300"``, ``"-1"``) or a duration (``"5m"``,
#: ``"1h30m"``); the document's pattern and the check are this one expression.
KEEP_ALIVE_TEXT = r"^(-?[0-9]+(\.[0-9]+)?|(-?[0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+)$"
_KEEP_ALIVE_TEXT = re.compile(KEEP_ALIVE_TEXT)
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_seconds(value: Any) -> float | None:
    """Ollama's ``keep_alive`` in seconds: None when absent, ``inf`` when negative."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise field_error("must be a number of seconds or a duration")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        if not _KEEP_ALIVE_TEXT.fullmatch(value):
            raise field_error(f"{value!r} is not a duration like '5m' or '1h'")
        try:
            seconds = float(value)
        except ValueError:
            seconds = sum(float(n) * _UNIT_S[u] for n, u in _DURATION.findall(value))
    else:
        raise field_error("must be a number of seconds or a duration")
    if not math.isfinite(seconds):  # "inf", "nan": negative means forever
        raise field_error("must be a finite number (negative keeps it loaded)")
    return math.inf if seconds < 0 else seconds


#: Validated into seconds (``inf``: until memory is needed).
KeepAlive = Annotated[
    float | None,
    PlainValidator(
        keep_alive_seconds,
        json_schema_input_type=float | Annotated[str, Field(pattern=KEEP_ALIVE_TEXT)] | None,
    ),
    Field(
        description="Idle time the service stays loaded: seconds or a duration ('5m', '1h'); "
        "0 unloads when idle, negative keeps it until memory is needed."
    ),
]
Format = Annotated[
    Literal["json", ""] | dict[str, Any] | None,
    one_error('must be "json" or a JSON schema object'),
    Field(description='"json", or a JSON schema the answer follows (chat models).'),
]
#: The largest ``num_ctx`` taken (2^20 tokens: beyond any model served here).
MAX_NUM_CTX = 1 << 20


class OllamaOptions(RequestModel):
    """The options read (others are ignored, as Ollama ignores what a model does not
    know); each is checked by type and range under its own name (``options.num_ctx``)."""

    num_predict: Annotated[
        JsonInt | None, Field(ge=-2, description="Tokens to generate (-1, -2: no limit).")
    ] = None
    num_ctx: Annotated[
        JsonInt | None,
        Field(ge=1, le=MAX_NUM_CTX, description="Context window (the service's own is used)."),
    ] = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: Annotated[JsonInt | None, Field(ge=0)] = None
    seed: JsonInt | None = None
    stop: Stop = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    repeat_penalty: Annotated[float | None, Field(ge=0, le=10)] = None


Options = Annotated[
    OllamaOptions | None,
    Field(
        description="temperature, top_p, seed, stop, num_predict and the three penalties "
        "are used; others are ignored."
    ),
]
NoImages = Annotated[
    list[Any] | None,
    Field(max_length=0, description="Not supported: absent or empty."),
    one_error("are not supported by these models"),
]
Stream = Annotated[bool | None, Field(description="Default true (NDJSON).")]
UnsupportedText = Annotated[
    str | None,
    Field(max_length=0, description="Not supported: absent or empty."),
    one_error("is not supported here"),
]
UnsupportedTokens = Annotated[
    list[JsonInt] | None,
    Field(max_length=0, description="Not supported: absent or empty."),
    one_error("is not supported here"),
]


def _example(example: dict[str, Any]) -> ConfigDict:
    return ConfigDict(json_schema_extra={"examples": [example]})


class OllamaFunctionCall(RequestModel):
    name: str
    arguments: dict[str, Any] | None = None


class OllamaToolCall(RequestModel):
    function: OllamaFunctionCall


class OllamaMessage(RequestModel):
    role: Annotated[str, Field(min_length=1)]
    content: Content = None
    images: NoImages = None
    tool_calls: (
        list[Annotated[OllamaToolCall, one_error("must be a function with a name")]] | None
    ) = None
    tool_name: str | None = None


class OllamaChatRequest(RequestModel):
    model_config = _example(
        {
            "model": "chat",
            "messages": [{"role": "user", "content": "Is the kitchen light on?"}],
            "stream": False,
            "options": {"num_predict": 64},
            "keep_alive": "10m",
        }
    )

    model: ModelName
    messages: Annotated[
        list[OllamaMessage] | None, Field(description="None or empty: load (or unload).")
    ] = None
    tools: list[Tool] | None = None
    format: Format = None
    options: Options = None
    stream: Stream = None
    keep_alive: KeepAlive = None


class OllamaGenerateRequest(RequestModel):
    model_config = _example(
        {"model": "completion", "prompt": "The kitchen light is", "stream": False}
    )

    model: ModelName
    prompt: Annotated[str | None, Field(description="Empty: only load (or unload).")] = None
    images: NoImages = None
    suffix: UnsupportedText = None
    template: UnsupportedText = None
    context: UnsupportedTokens = None
    system: str | None = None
    raw: Annotated[bool | None, Field(description="true: the prompt as it is.")] = None
    format: Format = None
    options: Options = None
    stream: Stream = None
    keep_alive: KeepAlive = None


class OllamaEmbedRequest(RequestModel):
    model_config = _example({"model": "embeddings", "input": ["a cat", "a kitten"]})

    model: ModelName
    input: EmbeddingsInput
    keep_alive: KeepAlive = None


class OllamaEmbeddingsRequest(RequestModel):
    model_config = _example({"model": "embeddings", "prompt": "a cat"})

    model: ModelName
    prompt: EmbeddingsInput
    keep_alive: KeepAlive = None


#: ``model`` or ``name``, a non-empty string (what ``OllamaShowRequest._named`` checks).
_NAMED: dict[str, Any] = {
    "anyOf": [
        {"required": [field], "properties": {field: {"type": "string", "minLength": 1}}}
        for field in ("model", "name")
    ]
}


class OllamaShowRequest(RequestModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"model": "chat"}], **_NAMED})

    model: Annotated[str | None, Field(description="The model (or give it as name).")] = None
    name: str | None = None

    @model_validator(mode="after")
    def _named(self) -> Self:
        if not (self.model or self.name):
            raise field_error("is required and must be a non-empty string", param="model")
        return self

    def chosen(self) -> str:
        return self.model or self.name or ""
