"""The body of ``POST /v1/jobs``: one pydantic model, the one source of its validation
(:mod:`.http`, for a JSON body and, with the model from the query, for a JSON-lines
body) and of its schema in the OpenAPI document.

The limits are the API's (:class:`JobLimits`), given to the checks as the validation
context; the schema states the default ones. Each problem carries the jobs API's own
code (:func:`job_error_code`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, ValidationInfo

from accelmux.request_validation import RequestModel, field_error, one_error


@dataclass(frozen=True, slots=True, kw_only=True)
class JobLimits:
    max_body_bytes: int = 64 * 1024**2
    max_inputs: int = 100_000
    max_input_chars: int = 100_000
    max_model_chars: int = 200
    max_metadata_keys: int = 16
    max_metadata_chars: int = 512
    max_page: int = 1000
    default_page: int = 100
    max_list: int = 100


DEFAULT_LIMITS = JobLimits()


def limits_context(limits: JobLimits) -> dict[str, Any]:
    """The validation context that sets the limits (``model_validate(..., context=)``)."""
    return {"limits": limits}


def _limits(info: ValidationInfo) -> JobLimits:
    limits = (info.context or {}).get("limits")
    return limits if isinstance(limits, JobLimits) else DEFAULT_LIMITS


def _given(value: Any) -> Any:
    if value is None:
        raise field_error("is required", kind="missing_field")
    return value


def _named(value: Any) -> Any:
    return _given(None if value == "" else value)


def _model_length(model: str, info: ValidationInfo) -> str:
    if len(model) > _limits(info).max_model_chars:
        raise field_error("is too long")
    return model


def _input_length(text: str, info: ValidationInfo) -> str:
    limit = _limits(info).max_input_chars
    if len(text) > limit:
        raise field_error(f"is longer than {limit} characters", kind="input_too_long")
    return text


def _input_count(inputs: list[str], info: ValidationInfo) -> list[str]:
    limit = _limits(info).max_inputs
    if len(inputs) > limit:
        raise field_error(f"may hold at most {limit} inputs", kind="too_many_inputs")
    return inputs


def _metadata_size(metadata: dict[str, str] | None, info: ValidationInfo) -> dict[str, str]:
    if metadata is None:
        return {}
    limits = _limits(info)
    if len(metadata) > limits.max_metadata_keys or any(
        len(k) > limits.max_metadata_chars or len(v) > limits.max_metadata_chars
        for k, v in metadata.items()
    ):
        raise field_error(
            f"takes at most {limits.max_metadata_keys} keys of "
            f"{limits.max_metadata_chars} characters"
        )
    return metadata


Input = Annotated[
    str,
    Field(min_length=1, json_schema_extra={"maxLength": DEFAULT_LIMITS.max_input_chars}),
    AfterValidator(_input_length),
]


class JobSubmitRequest(RequestModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"model": "embeddings", "inputs": ["a cat", "a kitten"], "metadata": {"k": "v"}}
            ]
        },
    )

    model: Annotated[
        str,
        BeforeValidator(_named),
        Field(
            min_length=1,
            description="An embeddings model.",
            json_schema_extra={"maxLength": DEFAULT_LIMITS.max_model_chars},
        ),
        AfterValidator(_model_length),
    ]
    inputs: Annotated[
        list[Input],
        BeforeValidator(_given),
        Field(min_length=1, json_schema_extra={"maxItems": DEFAULT_LIMITS.max_inputs}),
        AfterValidator(_input_count),
    ]
    metadata: Annotated[
        dict[str, str] | None,
        one_error("must map strings to strings", kind="invalid_type"),
        Field(
            json_schema_extra={"maxProperties": DEFAULT_LIMITS.max_metadata_keys},
            description=f"Up to {DEFAULT_LIMITS.max_metadata_keys} keys and values of "
            f"{DEFAULT_LIMITS.max_metadata_chars} characters.",
        ),
        AfterValidator(_metadata_size),
    ] = None


#: The jobs API's code of each pydantic error type it can meet (the model's own checks
#: raise theirs: ``missing_field``, ``input_too_long``, ``too_many_inputs`` ...).
_CODES = {"missing": "missing_field", "extra_forbidden": "unknown_field"}
_OWN = {"missing_field", "invalid_type", "invalid_value", "input_too_long", "too_many_inputs"}


def job_error_code(kind: str) -> str:
    if kind in _OWN:
        return kind
    if kind in _CODES:
        return _CODES[kind]
    return "invalid_type" if kind.endswith("_type") else "invalid_value"
