"""The OpenAI request bodies the gateway takes: one pydantic model per endpoint, the one
source of their validation (:mod:`.parse`) and of their schemas in the OpenAPI document
(:mod:`.openapi`).

Only the fields accelmux reads or checks are declared; every other field is ignored
here and reaches the backend unchanged (an external server gets the body as it came).
The shapes of ``tools`` / ``tool_choice``, ``response_format``, ``stream_options`` and
``stop`` are checked before admission, each answered with a 400 naming the field when
it is wrong; what a backend then does with them is the backend's part: the embedded
llama.cpp model holds its output to them with a grammar, an external server gets them
unchanged, and a backend that cannot do one answers a 400 naming it.

How an error becomes ``param``: :mod:`accelmux.request_validation`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    model_validator,
)

from accelmux.config.limits import MAX_EMBEDDING_INPUTS
from accelmux.request_validation import JsonInt, RequestModel, field_error, one_error

TOOL_NAME = r"^[A-Za-z0-9_-]{1,64}$"
MAX_N = 16
MAX_STOP = 4
MAX_IMAGES = 10
#: OpenAI's ceiling on ``top_logprobs``.
MAX_TOP_LOGPROBS = 20
MAX_SPEECH_CHARS = 4096
IMAGE_SIDE = (16, 8192)
#: One side, 16..8192, as a pattern (the document's; ``_within_sides`` checks the same).
_SIDE = r"(1[6-9]|[2-9][0-9]|[1-9][0-9]{2}|[1-7][0-9]{3}|80[0-9]{2}|81[0-8][0-9]|819[0-2])"
IMAGE_SIZE = rf"^{_SIDE}[xX]{_SIDE}$"

ModelName = Annotated[str, Field(min_length=1, description="A service's model name or alias.")]
# JSON numbers as they are: "5" is not 5 (a string where a number belongs is refused)
PositiveInt = Annotated[JsonInt, Field(ge=1)]
Choices = Annotated[
    JsonInt,
    Field(ge=1, le=MAX_N, description="Choices to generate (a stream holds one)."),
]
Temperature = Annotated[float, Field(ge=0, le=2, description="0..2.")]
TopP = Annotated[float, Field(ge=0, le=1, description="0..1.")]
Penalty = Annotated[float, Field(ge=-2, le=2, description="-2..2.")]
TopLogprobs = Annotated[JsonInt, Field(ge=0, le=MAX_TOP_LOGPROBS, description="0..20.")]

#: A message's content: a string, or parts (objects: ``{"type": "text", "text": ...}``).
Content = Annotated[
    str | list[dict[str, Any]] | None,
    one_error("must be a string or a list of parts (objects)"),
]
Stop = Annotated[
    str | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=MAX_STOP)] | None,
    one_error(f"must be a string or up to {MAX_STOP} non-empty strings"),
]


def _example(example: dict[str, Any]) -> ConfigDict:
    return ConfigDict(json_schema_extra={"examples": [example]})


class StreamOptions(RequestModel):
    include_usage: bool | None = None


StreamOptionsField = Annotated[
    StreamOptions | None,
    one_error("must be an object whose include_usage is a boolean"),
    Field(description="Only with stream: true; include_usage adds a final usage chunk."),
]


def _stream_options_need_a_stream(options: StreamOptions | None, stream: bool | None) -> None:
    if options is not None and stream is not True:
        raise field_error("is only allowed with 'stream': true", param="stream_options")


class ChatMessage(RequestModel):
    role: Annotated[str, Field(min_length=1)]
    content: Content = None


class ToolFunction(RequestModel):
    name: Annotated[
        str, Field(pattern=TOOL_NAME), one_error("must be 1 to 64 letters, digits, '_' or '-'")
    ]
    parameters: Annotated[
        dict[str, Any] | None,
        one_error("must be a JSON schema object"),
        Field(description="A JSON schema object."),
    ] = None


class Tool(RequestModel):
    type: Literal["function"] = "function"
    function: ToolFunction

    @model_validator(mode="before")
    @classmethod
    def _functions_only(cls, data: Any) -> Any:
        # reported at the tool (as "tools[0]"), as the only kind there is
        if isinstance(data, dict) and data.get("type", "function") != "function":
            raise field_error("must be an object of type 'function'")
        return data


class ToolChoiceName(RequestModel):
    name: str


class ToolChoiceFunction(RequestModel):
    function: ToolChoiceName


ToolChoice = Annotated[
    Literal["none", "auto", "required"] | ToolChoiceFunction | None,
    one_error("must be none, auto, required or one of the tools by name"),
    Field(description="Needs 'tools'; an object names one of them."),
]


class JsonSchemaFormat(RequestModel):
    schema_: Annotated[dict[str, Any], Field(alias="schema", description="A JSON schema.")]


class ResponseFormat(RequestModel):
    # what _schema_given checks, as the document states it
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"properties": {"type": {"enum": ["text", "json_object"]}}},
                {"required": ["json_schema"], "properties": {"json_schema": {"type": "object"}}},
            ]
        }
    )

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> Self:
        if self.type == "json_schema" and self.json_schema is None:
            raise field_error("needs json_schema.schema")
        return self


ResponseFormatField = Annotated[
    ResponseFormat | None,
    one_error(
        "must be an object whose type is text, json_object or json_schema "
        "(json_schema with json_schema.schema, a JSON schema object)"
    ),
]


#: The rules across fields, as the document states them (the models check them in
#: ``_across_fields``): ``stream_options`` only with ``"stream": true``, and
#: ``tool_choice`` only with ``tools``. That a named ``tool_choice`` names one of the
#: tools JSON Schema cannot state; the field's description does.
STREAM_OPTIONS_NEED_A_STREAM = {
    "anyOf": [
        {"properties": {"stream_options": {"type": "null"}}},
        {"required": ["stream"], "properties": {"stream": {"const": True}}},
    ]
}
TOOL_CHOICE_NEEDS_TOOLS = {
    "anyOf": [
        {"properties": {"tool_choice": {"type": "null"}}},
        {"required": ["tools"], "properties": {"tools": {"type": "array", "minItems": 1}}},
    ]
}


def _rules(example: dict[str, Any], *rules: dict[str, Any]) -> ConfigDict:
    extra: dict[str, Any] = {"examples": [example]}
    if len(rules) == 1:
        extra.update(rules[0])
    elif rules:
        extra["allOf"] = list(rules)
    return ConfigDict(json_schema_extra=extra)


class ChatRequest(RequestModel):
    model_config = _rules(
        {
            "model": "chat",
            "messages": [
                {"role": "system", "content": "You are a helpful home assistant."},
                {"role": "user", "content": "Is the kitchen light on?"},
            ],
            "max_tokens": 64,
            "stream": False,
        },
        STREAM_OPTIONS_NEED_A_STREAM,
        TOOL_CHOICE_NEEDS_TOOLS,
    )

    model: ModelName
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    stream_options: StreamOptionsField = None
    stop: Stop = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice = None
    response_format: ResponseFormatField = None
    n: Choices | None = None
    max_completion_tokens: PositiveInt | None = None
    max_tokens: PositiveInt | None = None
    stream: bool | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    seed: JsonInt | None = None
    logprobs: StrictBool | None = None
    top_logprobs: TopLogprobs | None = None

    @model_validator(mode="after")
    def _across_fields(self) -> Self:
        _stream_options_need_a_stream(self.stream_options, self.stream)
        choice = self.tool_choice
        if choice is None:
            return self
        if not self.tools:
            raise field_error("needs 'tools'", param="tool_choice")
        names = {tool.function.name for tool in self.tools}
        if isinstance(choice, ToolChoiceFunction) and choice.function.name not in names:
            raise field_error(
                "must be none, auto, required or one of the tools by name", param="tool_choice"
            )
        return self


Prompt = Annotated[
    str
    # more than one prompt is refused by the gateway (unsupported): the document says so
    | Annotated[list[str], Field(min_length=1, json_schema_extra={"maxItems": 1})]
    | Annotated[list[JsonInt], Field(min_length=1)],
    one_error("must be a string, an array of strings or of tokens"),
]


class CompletionRequest(RequestModel):
    model_config = _rules(
        {"model": "completion", "prompt": "The kitchen light is", "max_tokens": 16},
        STREAM_OPTIONS_NEED_A_STREAM,
    )

    model: ModelName
    prompt: Prompt
    stream_options: StreamOptionsField = None
    stop: Stop = None
    n: Choices | None = None
    max_completion_tokens: PositiveInt | None = None
    max_tokens: PositiveInt | None = None
    stream: bool | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    seed: JsonInt | None = None

    @model_validator(mode="after")
    def _across_fields(self) -> Self:
        _stream_options_need_a_stream(self.stream_options, self.stream)
        return self


EmbeddingInput = Annotated[
    str | JsonInt | list[JsonInt], one_error("must be a string or token array (integers)")
]
EmbeddingInputs = Annotated[
    list[EmbeddingInput], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)
]


def _one_text_as_a_list(value: Any) -> list[Any]:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise field_error("must be a string or a non-empty array")
    return value


#: A text, or up to 2048 texts or token arrays; validated as a list (a text is a list of
#: one), so that a bad item is named by its index (``input[3]``).
EmbeddingsInput = Annotated[
    EmbeddingInputs,
    BeforeValidator(_one_text_as_a_list, json_schema_input_type=str | EmbeddingInputs),
]


class EmbeddingsRequest(RequestModel):
    model_config = _example({"model": "embeddings", "input": ["a cat", "a kitten"]})

    model: ModelName
    input: EmbeddingsInput
    encoding_format: Annotated[
        Literal["float", "base64"] | None,
        one_error("must be float or base64"),
        Field(description="float (lists of numbers) or base64 (little-endian float32)."),
    ] = None
    dimensions: Annotated[
        JsonInt | None,
        Field(ge=1, description="Only the model's own size (a backend refuses any other)."),
    ] = None


class SpeechRequest(RequestModel):
    model_config = _example({"model": "tts", "input": "The kitchen lights are on."})

    model: ModelName
    input: Annotated[str, Field(min_length=1, max_length=MAX_SPEECH_CHARS)]
    voice: str | None = None
    response_format: Annotated[
        Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] | None,
        one_error("must be mp3, opus, aac, flac, wav or pcm"),
        Field(description="What the backend produces: the embedded and fake ones wav or pcm."),
    ] = None
    speed: Annotated[float | None, Field(ge=0.25, le=4.0)] = None


def _within_sides(size: str) -> str:
    lo, hi = IMAGE_SIDE
    if not all(lo <= int(side) <= hi for side in size.lower().split("x")):
        raise field_error("has a side out of range")
    return size


class ImageRequest(RequestModel):
    model_config = _example(
        {"model": "image", "prompt": "a red bicycle", "size": "256x256", "n": 1}
    )

    model: ModelName
    prompt: Annotated[str, Field(min_length=1)]
    # a number, never null: image backends read it as one
    n: Annotated[JsonInt, Field(ge=1, le=MAX_IMAGES)] = 1
    size: Annotated[
        str,
        Field(pattern=IMAGE_SIZE, description="WIDTHxHEIGHT, 16..8192 each."),
        AfterValidator(_within_sides),
        one_error("must be WIDTHxHEIGHT, 16..8192 each"),
    ] = "1024x1024"
    response_format: Literal["b64_json", "url"] | None = None

    def sides(self) -> tuple[int, int]:
        width, height = self.size.lower().split("x")
        return int(width), int(height)


#: The ``format`` of a base64 image in the document (a string of that format decodes to
#: an image file the gateway recognises).
IMAGE_BASE64 = "base64-image"
#: A 1x1 PNG, the smallest image a detection example can carry.
TINY_PNG_B64 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGMQUDAAAACkAGE0Zn1yAAAAAElFTkSuQmCC"
)


class DetectionRequest(RequestModel):
    model_config = _example({"model": "detect", "image": TINY_PNG_B64})

    model: ModelName
    image: Annotated[
        str,
        Field(
            min_length=1,
            description="A base64 image (PNG, JPEG, GIF, WebP or BMP), or a data URL.",
            json_schema_extra={"format": IMAGE_BASE64},
        ),
    ]


#: The names a multipart form's fields may have (a part named otherwise is refused by
#: the multipart parser as a malformed header).
FORM_FIELD_NAMES: dict[str, Any] = {"propertyNames": {"pattern": r"^[^\u0000-\u001f\u007f\"\\]*$"}}


class DetectionForm(RequestModel):
    """``/v1/detections`` as multipart: an image file."""

    model_config = ConfigDict(json_schema_extra=FORM_FIELD_NAMES)

    model: ModelName
    image: Annotated[bytes, Field(min_length=1, description="The image file.")]


class TranscriptionForm(RequestModel):
    """``/v1/audio/transcriptions``: multipart, the audio as ``file``."""

    model_config = ConfigDict(json_schema_extra=FORM_FIELD_NAMES)

    model: ModelName
    file: Annotated[
        bytes,
        Field(
            min_length=1,
            description="The audio: WAV, MP3, FLAC, Ogg, WebM, M4A, AMR or AIFF.",
        ),
    ]
    # a form field is a string or absent (no null): absent is the default
    response_format: Literal["json", "text", "verbose_json", "srt", "vtt"] = "json"
    language: str = ""
