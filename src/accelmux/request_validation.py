"""What the pydantic request models share, and how a validation error becomes the
``param`` an OpenAI client reads.

The request models (``gateway/openai_requests.py``, ``gateway/ollama_requests.py``,
``jobs/submit_request.py``) are the one source of both the request validation and the
request schemas of the OpenAPI document. Their errors stay as precise as hand-written
checks by four rules:

* a model is strict (:class:`RequestModel`): a JSON value is taken as it is, never
  converted (``"yes"`` is not ``true``, ``"2"`` is not an integer), except that an
  integer may be written ``2.0``, as JSON Schema's ``integer`` allows (:data:`JsonInt`);
  fields not declared are ignored, so the many optional fields OpenAI clients send pass
  through unchanged;
* an error's location becomes a param the way OpenAI writes it:
  ``("messages", 0, "role")`` -> ``messages[0].role`` (:func:`param_of`);
* a union other than ``X | None`` is wrapped by :func:`one_error`, so that it fails once,
  at its own field, with one message (pydantic reports one error per member, at
  locations that carry the member's type);
* a check across fields raises :func:`field_error` from a model validator with the field
  it names in ``param`` (a model validator's own location is the whole object).

Only the first problem is answered, as a hand-written check answers, except that an
unknown field (where a model forbids them) comes first: a misspelt field is then named
rather than the required one it stands for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, cast

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    GetCoreSchemaHandler,
    StrictInt,
    ValidationError,
)
from pydantic.json_schema import (
    DEFAULT_REF_TEMPLATE,
    DefsRef,
    GenerateJsonSchema,
    JsonSchemaKeyT,
    JsonSchemaMode,
    JsonSchemaValue,
)
from pydantic_core import CoreSchema, ErrorDetails, PydanticCustomError, core_schema

#: The kind of every error a request model raises itself (the gateway's ``error.code``).
INVALID = "invalid_value"

#: Pydantic's error types, as the phrase that follows the param in a message.
_PHRASES = {
    "missing": "is required",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "bool_type": "must be a boolean",
    "bytes_type": "must be a file",
    "list_type": "must be an array",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "string_too_long": "must be at most {max_length} characters",
    "too_long": "may hold at most {max_length} items",
    "greater_than_equal": "must be >= {ge} (got {input})",
    "less_than_equal": "must be <= {le} (got {input})",
    "literal_error": "must be {expected}",
    "string_pattern_mismatch": "must match {pattern}",
    "extra_forbidden": "is not a known field",
}


#: pydantic's names of the bounds it could not put on a type of its own (a constrained
#: type behind a validator), and JSON Schema's names of them.
_BOUNDS = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}


def _json_schema_bounds(node: Any) -> Any:
    if isinstance(node, list):
        return [_json_schema_bounds(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    numeric = node.get("type") in ("integer", "number")
    for key, value in node.items():
        if numeric and key in _BOUNDS:
            out[_BOUNDS[key]] = value
        elif key in ("properties", "$defs", "patternProperties"):
            out[key] = {name: _json_schema_bounds(sub) for name, sub in value.items()}
        else:
            out[key] = _json_schema_bounds(value)
    return out


class RequestSchema(GenerateJsonSchema):
    """The JSON schema of a request model, its bounds in JSON Schema's words."""

    def generate(self, schema: CoreSchema, mode: JsonSchemaMode = "validation") -> JsonSchemaValue:
        return cast(JsonSchemaValue, _json_schema_bounds(super().generate(schema, mode)))

    def generate_definitions(
        self, inputs: Sequence[tuple[JsonSchemaKeyT, JsonSchemaMode, CoreSchema]]
    ) -> tuple[dict[tuple[JsonSchemaKeyT, JsonSchemaMode], JsonSchemaValue], dict[DefsRef, Any]]:
        keys, defs = super().generate_definitions(inputs)
        return keys, cast(dict[DefsRef, Any], _json_schema_bounds(defs))


class RequestModel(BaseModel):
    """The base of every request model: strict, undeclared fields ignored."""

    model_config = ConfigDict(strict=True, extra="ignore")

    @classmethod
    def model_json_schema(
        cls,
        by_alias: bool | None = None,
        ref_template: str = DEFAULT_REF_TEMPLATE,
        schema_generator: type[GenerateJsonSchema] = RequestSchema,
        mode: JsonSchemaMode = "validation",
        *,
        union_format: Literal["any_of", "primitive_type_array"] = "any_of",
    ) -> dict[str, Any]:
        return super().model_json_schema(
            by_alias, ref_template, schema_generator, mode, union_format=union_format
        )


@dataclass(frozen=True, slots=True)
class Problem:
    """The first thing wrong with a request."""

    param: str | None
    message: str
    #: pydantic's error type (``missing``, ``string_type``...) or the kind a model's own
    #: check raised (:data:`INVALID`, or a code of the jobs API)
    kind: str


def param_of(loc: Sequence[int | str]) -> str | None:
    """``("messages", 0, "role")`` -> ``messages[0].role``; ``()`` -> None."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out or None


def first_problem(exc: ValidationError) -> Problem:
    """The problem a request is answered with: the first error (an unknown field first)."""
    errors = exc.errors(include_url=False)
    error = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    ctx = error.get("ctx") or {}
    loc = (*error["loc"], ctx["param"]) if ctx.get("param") else error["loc"]
    param = param_of(loc)
    phrase = _phrase(error)
    message = f"'{param}' {phrase}" if param else phrase
    return Problem(param, message, error["type"])


def _phrase(error: ErrorDetails) -> str:
    ctx = error.get("ctx") or {}
    if error["type"] in ("too_short", "string_too_short") and ctx.get("min_length") == 1:
        return "must not be empty"
    template = _PHRASES.get(error["type"])
    if template is None:
        return error["msg"]
    try:
        return template.format(input=error.get("input"), **ctx)
    except (KeyError, IndexError):
        return error["msg"]


def field_error(message: str, *, kind: str = INVALID, param: str | None = None) -> Exception:
    """The error a model's own check raises: ``message`` follows the param (``"must be
    a boolean"``); ``param``: the field a model validator's check is about."""
    return PydanticCustomError(kind, message, {"param": param} if param else None)


@dataclass(frozen=True, slots=True)
class _OneError:
    message: str
    kind: str

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.custom_error_schema(
            handler(source), custom_error_type=self.kind, custom_error_message=self.message
        )


def one_error(message: str, *, kind: str = INVALID) -> Any:
    """An annotation: any failure of the annotated value is one error at its own
    location (pydantic-core replaces the inner errors; the schema is the inner one's)."""
    return _OneError(message, kind)


def _digits_as_int(value: Any) -> Any:
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        try:
            return int(value)
        except ValueError:  # digits int() does not read, such as superscripts
            return value
    return value


#: An integer, also given as a string of digits (``"16"``), as clients of form-encoded
#: APIs send it; never a boolean or a float.
LenientInt = Annotated[StrictInt, BeforeValidator(_digits_as_int)]


def _integral(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


#: A JSON integer as JSON Schema has it: ``16`` or ``16.0`` (a number without a fraction),
#: never ``16.5``, ``"16"`` nor a boolean (what the document's ``"type": "integer"`` says).
JsonInt = Annotated[StrictInt, BeforeValidator(_integral)]
