"""The OpenAPI 3.1 document of accelmux's HTTP API, served at ``/openapi.json``.

The schemas of the request bodies, with an example each, are the JSON schemas of the
request models that validate them (:mod:`.openai_requests`, :mod:`.ollama_requests`,
:mod:`accelmux.jobs.submit_request`): one source, so the document cannot drift from what
the gateway accepts (OpenAPI 3.1's schemas are JSON Schema 2020-12, what pydantic
writes). Paths and responses are declared here, the error shape after :mod:`.errors`.
The tests check that every route is documented, that every request schema is its
model's, and that the running gateway accepts every example.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic.json_schema import models_json_schema

from accelmux import __version__
from accelmux.gateway.ollama_requests import (
    OllamaChatRequest,
    OllamaEmbeddingsRequest,
    OllamaEmbedRequest,
    OllamaGenerateRequest,
    OllamaShowRequest,
)
from accelmux.gateway.openai_requests import (
    ChatRequest,
    CompletionRequest,
    DetectionForm,
    DetectionRequest,
    EmbeddingsRequest,
    ImageRequest,
    SpeechRequest,
    TranscriptionForm,
)
from accelmux.jobs.store import JOB_ID_PATTERN
from accelmux.jobs.submit_request import DEFAULT_LIMITS, JobSubmitRequest
from accelmux.request_validation import RequestModel, RequestSchema

#: Where a request model's schema sits in the document.
REF_TEMPLATE = "#/components/schemas/{model}"
#: The JSON request body of each path, by the model that validates it.
JSON_BODIES: dict[str, type[RequestModel]] = {
    "/v1/chat/completions": ChatRequest,
    "/v1/completions": CompletionRequest,
    "/v1/embeddings": EmbeddingsRequest,
    "/v1/audio/speech": SpeechRequest,
    "/v1/images/generations": ImageRequest,
    "/v1/detections": DetectionRequest,
    "/v1/jobs": JobSubmitRequest,
    "/api/chat": OllamaChatRequest,
    "/api/generate": OllamaGenerateRequest,
    "/api/embed": OllamaEmbedRequest,
    "/api/embeddings": OllamaEmbeddingsRequest,
    "/api/show": OllamaShowRequest,
}
#: The multipart request body of each path (a ``bytes`` field is a file).
FORM_BODIES: dict[str, type[RequestModel]] = {
    "/v1/audio/transcriptions": TranscriptionForm,
    "/v1/detections": DetectionForm,
}
REQUEST_MODELS = (*JSON_BODIES.values(), *FORM_BODIES.values())


@functools.cache
def _request_schemas() -> dict[str, Any]:
    """Every request model's schema and those of the models inside them, by name."""
    _, top = models_json_schema(
        [(model, "validation") for model in REQUEST_MODELS],
        ref_template=REF_TEMPLATE,
        schema_generator=RequestSchema,
    )
    schemas: dict[str, Any] = top["$defs"]
    return schemas


def request_schemas() -> dict[str, Any]:
    return copy.deepcopy(_request_schemas())


#: What each multipart file must hold, as the gateway sniffs it (gateway/media.py), and
#: a file name for it: a part without one is a form field, not a file.
FILE_TYPES = {
    "file": ("audio/wav, audio/mpeg, audio/flac, audio/ogg, audio/webm, audio/mp4", "speech.wav"),
    "image": ("image/png, image/jpeg, image/gif, image/webp", "frame.png"),
}


def _file_part(field: str, kinds: str, filename: str) -> dict[str, Any]:
    disposition = f'form-data; name="{field}"; filename="{filename}"'
    return {
        "contentType": kinds,
        "headers": {
            "Content-Disposition": {
                "description": "A file part: it carries a file name.",
                "schema": {"type": "string"},
                "example": disposition,
            }
        },
    }


def model_names(names: list[str] | None, everyone: list[str]) -> dict[str, Any]:
    """The schema of a ``model`` field on a daemon that serves ``names`` on this route
    (``everyone``: every name it serves); no names: any name it does not serve (404)."""
    if names:
        return {"type": "string", "enum": list(names)}
    if everyone:
        return {"type": "string", "not": {"enum": list(everyone)}}
    return {"type": "string"}


def _media(
    model: type[RequestModel], names: list[str] | None, everyone: list[str]
) -> dict[str, Any]:
    ref = {"$ref": REF_TEMPLATE.format(model=model.__name__)}
    media: dict[str, Any] = {"schema": ref}
    examples = _request_schemas()[model.__name__].get("examples")
    example = copy.deepcopy(examples[0]) if examples else None
    if names is not None:
        # the model's own schema, inlined, with its ``model`` narrowed (inlined rather
        # than an ``allOf`` so that clients find the properties where they look)
        schema = copy.deepcopy(_request_schemas()[model.__name__])
        schema["properties"]["model"] = {
            **schema["properties"]["model"],
            **model_names(names, everyone),
        }
        schema.pop("examples", None)
        media["schema"] = schema
        if example is not None and names:
            example["model"] = names[0]
        elif example is not None:
            example = None  # no model here takes it
    if example is not None:
        media["example"] = example
    return media


def request_body(
    path: str, names: list[str] | None = None, everyone: list[str] | None = None
) -> dict[str, Any]:
    """The ``requestBody`` of ``path``: its JSON and multipart forms; ``names``: the
    models a daemon serves on it (its ``model`` field then takes only those)."""
    content: dict[str, Any] = {}
    others = everyone or []
    if path in JSON_BODIES:
        content["application/json"] = _media(JSON_BODIES[path], names, others)
    if path in FORM_BODIES:
        form = _media(FORM_BODIES[path], names, others)
        files = _request_schemas()[FORM_BODIES[path].__name__]["properties"]
        form["encoding"] = {
            field: _file_part(field, kinds, filename)
            for field, (kinds, filename) in FILE_TYPES.items()
            if field in files
        }
        content["multipart/form-data"] = form
    return {"required": True, "content": content}


_REF_ERR = {"$ref": "#/components/schemas/Error"}


def _err(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _REF_ERR}}}


def _retry(description: str) -> dict[str, Any]:
    out = _err(description)
    out["headers"] = {
        "Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait."}
    }
    return out


ERRORS = {
    "400": _err("A field is invalid; error.param names it."),
    "401": _err("Missing or invalid API key."),
    "404": _err("Unknown model."),
    "413": _err("Body too large, or the request can never fit (reason too_large)."),
    "429": _retry("Queue full (reason queue_full)."),
    "502": _err("The backend failed or crashed."),
    "503": _retry("Refused or timed out in the queue; error.code is the policy's reason."),
}


def _json_op(
    summary: str, path: str, response: dict[str, Any], *, stream: bool = False
) -> dict[str, Any]:
    ok: dict[str, Any] = {"description": "OK", "content": {"application/json": response}}
    if stream:
        ok["content"]["text/event-stream"] = {"schema": SSE_EVENT}
    return {
        "summary": summary,
        "requestBody": request_body(path),
        "responses": {"200": ok, **ERRORS},
    }


_OBJ = {"schema": {"type": "object"}}
#: One event of a server-sent event stream (before OpenAPI 3.2, ``schema`` describes each).
SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
}
#: What ``/v1/audio/speech`` answers, by its ``response_format`` and the backend.
SPEECH_TYPES = ("audio/wav", "audio/pcm", "audio/mpeg", "audio/opus", "audio/aac", "audio/flac")

#: The response schemas (the request schemas come from the request models).
SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": ["string", "null"]},
                    "code": {"type": ["string", "null"]},
                },
            }
        },
    },
    "DetectionResponse": {
        "type": "object",
        "properties": {
            "object": {"type": "string", "enum": ["detection"]},
            "model": {"type": "string"},
            "width": {"type": "integer"},
            "height": {"type": "integer"},
            "detections": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "label": {"type": "string"},
                        "score": {"type": "number"},
                        "box": {
                            "type": "array",
                            "items": {"type": "number"},
                            "minItems": 4,
                            "maxItems": 4,
                            "description": "[x1, y1, x2, y2] in pixels.",
                        },
                    },
                },
            },
        },
    },
}

_OLLAMA_ERR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string"}},
}
OLLAMA_SCHEMAS: dict[str, Any] = {"OllamaError": _OLLAMA_ERR}


def _ollama_op(summary: str, path: str, *, stream: bool = False) -> dict[str, Any]:
    ok: dict[str, Any] = {"description": "OK", "content": {"application/json": _OBJ}}
    if stream:
        ok["content"]["application/x-ndjson"] = {"schema": {"type": "string"}}
    err = {"application/json": {"schema": {"$ref": "#/components/schemas/OllamaError"}}}
    return {
        "summary": summary,
        "requestBody": request_body(path),
        "responses": {
            "200": ok,
            "400": {"description": "A field is invalid.", "content": err},
            "401": ERRORS["401"],
            "404": {"description": "Unknown model.", "content": err},
            "409": {
                "description": "An unload of a model the operator keeps loaded (service_pinned).",
                "content": err,
            },
            "413": {"description": "Body too large, or too_large.", "content": err},
            "429": {"description": "queue_full (Retry-After).", "content": err},
            "502": {"description": "The backend failed.", "content": err},
            "503": {"description": "Refused: the policy's reason (Retry-After).", "content": err},
        },
    }


def _ollama_get(summary: str) -> dict[str, Any]:
    return {
        "get": {
            "summary": summary,
            "responses": {
                "200": {"description": "OK", "content": {"application/json": _OBJ}},
                "401": ERRORS["401"],
            },
        }
    }


def ollama_paths() -> dict[str, Any]:
    """The Ollama API (``gateway/ollama_api.py``)."""
    return {
        "/api/chat": {
            "post": _ollama_op(
                "Ollama chat (NDJSON unless stream=false); no messages: load or unload (409 "
                "service_pinned when the operator keeps it loaded).",
                "/api/chat",
                stream=True,
            )
        },
        "/api/generate": {
            "post": _ollama_op(
                "Ollama generate (NDJSON unless stream=false); empty prompt: load or unload (409 "
                "service_pinned when the operator keeps it loaded).",
                "/api/generate",
                stream=True,
            )
        },
        "/api/embed": {"post": _ollama_op("Ollama embeddings (a batch).", "/api/embed")},
        "/api/embeddings": {
            "post": _ollama_op("Ollama embedding (one, legacy).", "/api/embeddings")
        },
        "/api/show": {"post": _ollama_op("Model details and capabilities.", "/api/show")},
        "/api/tags": _ollama_get("The LLM and embedding models (every name and alias)."),
        "/api/ps": _ollama_get(
            "Loaded models: resident size, size on a GPU, when the idle TTL unloads them."
        ),
        "/api/version": _ollama_get("The Ollama API version these shapes follow."),
    }


_JOB_ID = {
    "name": "job_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": JOB_ID_PATTERN},
}

_ADMIN_ERR = {"401": _err("Missing or invalid admin key."), "403": _err("Admin key required.")}


@dataclass(frozen=True, slots=True, kw_only=True)
class ServedModels:
    """What one daemon serves: the model names each request body's route takes, every
    name, and the services (the served document's ``model`` fields and path parameters
    take only these, so that it says what the daemon answers)."""

    by_path: Mapping[str, list[str]]
    everyone: list[str]
    services: list[str]
    #: JSON-schema rules a route's body also follows here (which model may do what).
    rules: Mapping[str, list[dict[str, Any]]] = field(default_factory=dict)


def _narrow(paths: dict[str, Any], served: ServedModels) -> None:
    for path, ops in paths.items():
        for op in ops.values():
            if "requestBody" in op:
                names = served.by_path.get(path, [])
                body = request_body(path, names, served.everyone)
                for media in body["content"].values():
                    media["schema"].setdefault("allOf", []).extend(served.rules.get(path, []))
                    if not media["schema"]["allOf"]:
                        del media["schema"]["allOf"]
                op["requestBody"] = body
            for param in op.get("parameters", ()):
                if param["in"] != "path":
                    continue
                if param["name"] == "model" and served.everyone:
                    param["schema"] = {"type": "string", "enum": list(served.everyone)}
                elif param["name"] == "name" and served.services:
                    param["schema"] = {"type": "string", "enum": list(served.services)}


def _int_param(name: str, low: int, high: int | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer", "minimum": low}
    if high is not None:
        schema["maximum"] = high
    return {"name": name, "in": "query", "schema": schema}


def document(served: ServedModels | None = None) -> dict[str, Any]:
    """The document; ``served``: a daemon's models, which its ``model`` fields then
    name (without: any string)."""
    paths: dict[str, Any] = {
        "/v1/models": {
            "get": {
                "summary": "List models (one entry per name and alias).",
                "responses": {
                    "200": {"description": "OK", "content": {"application/json": _OBJ}},
                    "401": ERRORS["401"],
                },
            }
        },
        "/v1/models/{model}": {
            "get": {
                "summary": "One model by name or alias.",
                "parameters": [
                    {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
                "responses": {
                    "200": {"description": "OK", "content": {"application/json": _OBJ}},
                    "401": ERRORS["401"],
                    "404": ERRORS["404"],
                },
            }
        },
        **ollama_paths(),
        "/v1/chat/completions": {
            "post": _json_op(
                "Chat completion (SSE with stream=true).", "/v1/chat/completions", _OBJ, stream=True
            )
        },
        "/v1/completions": {
            "post": _json_op(
                "Text completion (SSE with stream=true).", "/v1/completions", _OBJ, stream=True
            )
        },
        "/v1/embeddings": {"post": _json_op("Embeddings.", "/v1/embeddings", _OBJ)},
        "/v1/audio/speech": {
            "post": {
                **_json_op("Text to speech.", "/v1/audio/speech", _OBJ),
                "responses": {
                    "200": {
                        "description": "Audio",
                        "content": {
                            kind: {"schema": {"type": "string", "format": "binary"}}
                            for kind in SPEECH_TYPES
                        },
                    },
                    **ERRORS,
                },
            }
        },
        "/v1/images/generations": {
            "post": _json_op("Image generation.", "/v1/images/generations", _OBJ)
        },
        "/v1/audio/transcriptions": {
            "post": {
                "summary": "Speech to text (multipart upload).",
                "requestBody": request_body("/v1/audio/transcriptions"),
                "responses": {
                    "200": {
                        "description": "The text: JSON, or plain text, SRT or VTT as "
                        "response_format asks.",
                        "content": {
                            "application/json": _OBJ,
                            **{
                                kind: {"schema": {"type": "string"}}
                                for kind in ("text/plain", "application/x-subrip", "text/vtt")
                            },
                        },
                    },
                    **ERRORS,
                },
            }
        },
        "/v1/detections": {
            "post": {
                "summary": "Object detection: an image in, boxes with labels and scores out. "
                "JSON with a base64 'image', or multipart with an 'image' file.",
                "requestBody": request_body("/v1/detections"),
                "responses": {
                    "200": {
                        "description": "Boxes",
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/DetectionResponse"}
                            }
                        },
                    },
                    **ERRORS,
                },
            }
        },
        "/admin/status": {
            "get": {
                "summary": "Devices, services (ledger estimated and measured), queues, "
                "recent decisions with reasons, monitor samples.",
                "responses": {
                    "200": {"description": "OK", "content": {"application/json": _OBJ}},
                    **_ADMIN_ERR,
                },
            }
        },
        "/admin/services/{name}/{op}": {
            "post": {
                "summary": "Operator command: load, unload, pin or unpin a service.",
                "description": "unload of a pinned service is refused (409 service_pinned): "
                "unpin it first.",
                "parameters": [
                    {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}},
                    {
                        "name": "op",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string", "enum": ["load", "unload", "pin", "unpin"]},
                    },
                ],
                "responses": {
                    "200": {"description": "Accepted", "content": {"application/json": _OBJ}},
                    "404": _err("Unknown service or operation."),
                    "409": _err("unload of a pinned service: unpin it first."),
                    "503": _retry("Shutting down."),
                    **_ADMIN_ERR,
                },
            }
        },
        "/admin/explain": {
            "get": {
                "summary": "Why memory is full: per device, who holds what and what could go.",
                "responses": {
                    "200": {"description": "OK", "content": {"application/json": _OBJ}},
                    **_ADMIN_ERR,
                },
            }
        },
        "/admin/explain/{request_id}": {
            "get": {
                "summary": "The decisions one request went through (X-Request-Id), and the "
                "ledger when it was delayed or refused.",
                "parameters": [
                    {
                        "name": "request_id",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string"},
                    }
                ],
                "responses": {
                    "200": {"description": "OK", "content": {"application/json": _OBJ}},
                    "404": _err("No record of that request."),
                    **_ADMIN_ERR,
                },
            }
        },
        "/admin/events": {
            "get": {
                "summary": "Live decisions as server-sent events (event: decision).",
                "responses": {
                    "200": {
                        "description": "SSE",
                        "content": {"text/event-stream": {"schema": SSE_EVENT}},
                    },
                    **_ADMIN_ERR,
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics (admin side).",
                "responses": {
                    "200": {
                        "description": "OK",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    **_ADMIN_ERR,
                },
            }
        },
        "/v1/jobs": {
            "post": {
                "summary": "Create a durable batch job (embeddings): {model, inputs[], "
                "metadata?}, or a JSON-lines body with ?model=. Inputs run through the "
                "Manager as batch work, inside the model's maintenance windows.",
                "requestBody": request_body("/v1/jobs"),
                "responses": {
                    "200": {"description": "The job", "content": {"application/json": _OBJ}},
                    "400": ERRORS["400"],
                    "401": ERRORS["401"],
                    "413": ERRORS["413"],
                    "415": _err("Unsupported content type."),
                },
            },
            "get": {
                "summary": "The caller's jobs (every job with the admin key), newest first.",
                "parameters": [
                    _int_param("limit", 1, DEFAULT_LIMITS.max_list),
                    {
                        "name": "after",
                        "in": "query",
                        "schema": {"type": "string", "pattern": JOB_ID_PATTERN},
                    },
                ],
                "responses": {
                    "200": {"description": "OK", "content": {"application/json": _OBJ}},
                    "400": ERRORS["400"],
                    "401": ERRORS["401"],
                    "404": _err("No such job to list after (or another key's)."),
                },
            },
        },
        "/v1/jobs/{job_id}": {
            "get": {
                "summary": "One job.",
                "parameters": [_JOB_ID],
                "responses": {
                    "200": {"description": "OK", "content": {"application/json": _OBJ}},
                    "404": _err("No such job (or another key's)."),
                    "401": ERRORS["401"],
                },
            }
        },
        "/v1/jobs/{job_id}/results": {
            "get": {
                "summary": "Results by input index (paged).",
                "parameters": [
                    _JOB_ID,
                    _int_param("offset", 0),
                    _int_param("limit", 1, DEFAULT_LIMITS.max_page),
                ],
                "responses": {
                    "200": {"description": "OK", "content": {"application/json": _OBJ}},
                    "400": ERRORS["400"],
                    "404": _err("No such job (or another key's)."),
                    "401": ERRORS["401"],
                },
            }
        },
        "/v1/jobs/{job_id}/cancel": {
            "post": {
                "summary": "Cancel a job.",
                "parameters": [_JOB_ID],
                "responses": {
                    "200": {"description": "OK", "content": {"application/json": _OBJ}},
                    "404": _err("No such job (or another key's)."),
                    "409": _err("The job already finished."),
                    "401": ERRORS["401"],
                },
            }
        },
        "/admin/plan": {
            "post": {
                "summary": "Plan from the daemon's own request history (docs/plan.md): the "
                "body names the changes as `accelmux plan` spells them; the answer is its "
                "--json document.",
                "description": "The JSON body's keys (all optional; no body plans the "
                "history as it is): device_gib, budget_gib, add_device_gib, compute_scale, "
                "add_service, remove_service, set, policy, last, run "
                "(src/accelmux/server/plan_api.py).",
                "responses": {
                    "200": {"description": "The plan", "content": {"application/json": _OBJ}},
                    "400": _err("A key of the body is unknown or invalid; the message names it."),
                    "409": _err("A plan is being made already (one at a time)."),
                    "422": _err("No plan can be made: the reason (history too short, ...)."),
                    "502": _err("The plan did not answer JSON."),
                    "504": _err("The plan took longer than its limit."),
                    **_ADMIN_ERR,
                },
            }
        },
        "/admin/history": {
            "get": {
                "summary": "Memory timeline per service and device (dashboard).",
                "parameters": [{"name": "since", "in": "query", "schema": {"type": "number"}}],
                "responses": {
                    "200": {"description": "OK", "content": {"application/json": _OBJ}},
                    "400": ERRORS["400"],
                    **_ADMIN_ERR,
                },
            }
        },
        "/": {
            "get": {
                "summary": "The dashboard page.",
                "responses": {
                    "200": {
                        "description": "HTML",
                        "content": {"text/html": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
        "/health": {
            "get": {
                "summary": "Liveness.",
                "responses": {"200": {"description": "OK", "content": {"application/json": _OBJ}}},
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "This document (OpenAPI 3.0).",
                "responses": {"200": {"description": "OK", "content": {"application/json": _OBJ}}},
            }
        },
    }
    if served is not None:
        _narrow(paths, served)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "accelmux",
            "version": __version__,
            "description": "One gateway and resource manager for a home server's accelerator: "
            "OpenAI-compatible inference endpoints and an admin API.",
        },
        "paths": paths,
        "components": {
            "schemas": {**request_schemas(), **SCHEMAS, **OLLAMA_SCHEMAS},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
