"""The OpenAPI document's request bodies are the request models' own schemas, and the
running gateway holds to them: it accepts every example the document gives, and refuses
a body without a required field or with a field of a type the schema does not allow,
naming that field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from tests.live.support import base_config, default_services, live, run

from accelmux.gateway.openapi import (
    FORM_BODIES,
    JSON_BODIES,
    REF_TEMPLATE,
    REQUEST_MODELS,
    document,
)
from accelmux.request_validation import RequestModel

DOC = document()
SCHEMAS = DOC["components"]["schemas"]
#: Every JSON request body the document gives: (path, its example).
EXAMPLES = [
    (path, ops["post"]["requestBody"]["content"]["application/json"].get("example"))
    for path, ops in DOC["paths"].items()
    if "application/json" in ops.get("post", {}).get("requestBody", {}).get("content", {})
]


def examples_config() -> dict[str, Any]:
    """The default test stack with the model names the examples use."""
    services = default_services()
    services["embeddings"] = services.pop("embed")
    return base_config(**services)


def _schema_of(path: str, media: str) -> tuple[str, dict[str, Any]]:
    ref = DOC["paths"][path]["post"]["requestBody"]["content"][media]["schema"]["$ref"]
    name = ref.removeprefix(REF_TEMPLATE.format(model=""))
    return name, SCHEMAS[name]


def test_every_request_schema_is_its_models_json_schema() -> None:
    bodies = [(p, m, "application/json") for p, m in JSON_BODIES.items()]
    bodies += [(p, m, "multipart/form-data") for p, m in FORM_BODIES.items()]
    assert len(bodies) >= 14
    for path, model, media in bodies:
        name, documented = _schema_of(path, media)
        own = model.model_json_schema(ref_template=REF_TEMPLATE)
        nested = own.pop("$defs", {})
        assert name == model.__name__
        assert documented == own, path
        for sub, schema in nested.items():
            assert SCHEMAS[sub] == schema, (path, sub)


def test_no_request_body_is_declared_by_hand() -> None:
    """Every request body of the document points at a request model's schema."""
    models = {model.__name__ for model in REQUEST_MODELS}
    seen = 0
    for path, ops in DOC["paths"].items():
        for op in ops.values():
            for media in op.get("requestBody", {}).get("content", {}).values():
                name = media["schema"]["$ref"].removeprefix(REF_TEMPLATE.format(model=""))
                assert name in models, path
                seen += 1
    assert seen == len(JSON_BODIES) + len(FORM_BODIES)


def test_every_json_request_body_has_an_example_valid_by_its_model() -> None:
    assert {path for path, _ in EXAMPLES} == set(JSON_BODIES)
    for path, example in EXAMPLES:
        assert isinstance(example, dict), f"{path} has no example"
        JSON_BODIES[path].model_validate(example)


def test_the_gateway_accepts_every_example(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(examples_config(), tmp=tmp_path, extras=True) as lv:
            for path, example in EXAMPLES:
                status, out = await lv.post_any(path, json=example)
                assert status == 200, (path, out)
                assert out is None or out.get("error") is None, (path, out)

    run(body())


# ---- the gateway refuses what the schemas refuse ----------------------------------------------
def _allowed_types(schema: dict[str, Any]) -> set[str] | None:
    """The JSON types a property's schema allows (None: any)."""
    if "anyOf" in schema:
        kinds: set[str] = set()
        for option in schema["anyOf"]:
            more = _allowed_types(option)
            if more is None:
                return None
            kinds |= more
        return kinds
    if "$ref" in schema:
        return {"object"}
    kind = schema.get("type")
    if kind is None:
        return None
    return set(kind) if isinstance(kind, list) else {kind}


#: A value of each JSON type.
VALUES: list[tuple[str, Any]] = [
    ("object", {"x": 1}),
    ("array", ["x"]),
    ("boolean", True),
    ("integer", 7),
    ("number", 0.5),
    ("string", "x"),
]


def _wrong_values(schema: dict[str, Any]) -> list[Any]:
    """A value of each JSON type ``schema`` does not allow."""
    allowed = _allowed_types(schema)
    if allowed is None:
        return []
    if "number" in allowed:
        allowed.add("integer")
    return [value for kind, value in VALUES if kind not in allowed]


def _bad_bodies() -> list[tuple[str, str, dict[str, Any]]]:
    """(path, the field, a body wrong in that field alone), from the schemas."""
    out = []
    for path, example in EXAMPLES:
        assert isinstance(example, dict)
        schema = SCHEMAS[JSON_BODIES[path].__name__]
        for field in schema.get("required", []):
            out.append((path, field, {k: v for k, v in example.items() if k != field}))
        for field, prop in schema["properties"].items():
            for wrong in _wrong_values(prop):
                out.append((path, field, {**copy.deepcopy(example), field: wrong}))
    return out


BAD_BODIES = _bad_bodies()


def test_the_bad_bodies_cover_every_request_model() -> None:
    assert {path for path, _, _ in BAD_BODIES} == set(JSON_BODIES)
    assert len(BAD_BODIES) > 200


@pytest.mark.parametrize("prefix", ["/v1", "/api"])
def test_the_gateway_refuses_a_missing_or_mistyped_field_naming_it(
    tmp_path: Path, prefix: str
) -> None:
    async def body() -> None:
        async with live(examples_config(), tmp=tmp_path, extras=True) as lv:
            wrong = []
            for path, field, payload in BAD_BODIES:
                if not path.startswith(prefix):
                    continue
                status, out = await lv.post_any(path, json=payload)
                error = out.get("error") if isinstance(out, dict) else None
                if prefix == "/api":  # Ollama's shape: the message names the field
                    named = isinstance(error, str) and f"'{field}'" in error
                else:
                    named = isinstance(error, dict) and error.get("param") == field
                if status != 400 or not named:
                    wrong.append((path, field, payload, status, out))
            assert not wrong, wrong

    run(body())


def test_undeclared_fields_pass_except_in_a_jobs_body() -> None:
    """OpenAI and Ollama clients send many optional fields: they pass; the jobs API names
    an unknown field instead (its body has three)."""
    for path, example in EXAMPLES:
        model: type[RequestModel] = JSON_BODIES[path]
        body = {**(example or {}), "temperature": 0.2, "user": "u1", "logit_bias": {}}
        if path == "/v1/jobs":
            with pytest.raises(ValidationError):
                model.model_validate(body)
        else:
            model.model_validate(body)
