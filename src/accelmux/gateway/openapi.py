"""The OpenAPI 3.0 document of accelmux's HTTP API, served at ``/openapi.json``.

Hand-written to match :mod:`.parse` (request validation) and :mod:`.errors` (the
OpenAI error shape); the tests check that every route is documented.
"""

from __future__ import annotations

from typing import Any

from accelmux import __version__

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
    summary: str, schema: str, response: dict[str, Any], *, stream: bool = False
) -> dict[str, Any]:
    ok: dict[str, Any] = {"description": "OK", "content": {"application/json": response}}
    if stream:
        ok["content"]["text/event-stream"] = {"schema": {"type": "string"}}
    return {
        "summary": summary,
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
        },
        "responses": {"200": ok, **ERRORS},
    }


_OBJ = {"schema": {"type": "object"}}
_MODEL = {"type": "string", "minLength": 1, "description": "A service's model name or alias."}

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
                    "param": {"type": "string", "nullable": True},
                    "code": {"type": "string", "nullable": True},
                },
            }
        },
    },
    "ChatRequest": {
        "type": "object",
        "required": ["model", "messages"],
        "properties": {
            "model": _MODEL,
            "messages": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["role"],
                    "properties": {
                        "role": {"type": "string", "minLength": 1},
                        "content": {"type": "string", "nullable": True},
                    },
                },
            },
            "max_tokens": {"type": "integer", "minimum": 1},
            "max_completion_tokens": {"type": "integer", "minimum": 1},
            "n": {"type": "integer", "minimum": 1, "maximum": 16},
            "stream": {"type": "boolean"},
            "stream_options": {
                "type": "object",
                "properties": {"include_usage": {"type": "boolean"}},
            },
            "stop": {
                "oneOf": [
                    {"type": "string"},
                    {"type": "array", "maxItems": 4, "items": {"type": "string"}},
                ]
            },
            "tools": {"type": "array", "items": {"type": "object"}},
            "tool_choice": {
                "oneOf": [
                    {"type": "string", "enum": ["none", "auto", "required"]},
                    {"type": "object"},
                ]
            },
            "response_format": {
                "type": "object",
                "properties": {
                    "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]},
                    "json_schema": {"type": "object"},
                },
            },
        },
    },
    "CompletionRequest": {
        "type": "object",
        "required": ["model", "prompt"],
        "properties": {
            "model": _MODEL,
            "prompt": {
                "oneOf": [
                    {"type": "string"},
                    {"type": "array", "minItems": 1, "items": {"type": "string"}},
                ]
            },
            "max_tokens": {"type": "integer", "minimum": 1},
            "n": {"type": "integer", "minimum": 1, "maximum": 16},
            "stream": {"type": "boolean"},
        },
    },
    "EmbeddingsRequest": {
        "type": "object",
        "required": ["model", "input"],
        "properties": {
            "model": _MODEL,
            "input": {
                "oneOf": [
                    {"type": "string"},
                    {"type": "array", "minItems": 1, "maxItems": 2048, "items": {"type": "string"}},
                ]
            },
        },
    },
    "SpeechRequest": {
        "type": "object",
        "required": ["model", "input"],
        "properties": {
            "model": _MODEL,
            "input": {"type": "string", "minLength": 1, "maxLength": 4096},
            "voice": {"type": "string"},
            "response_format": {"type": "string"},
        },
    },
    "ImageRequest": {
        "type": "object",
        "required": ["model", "prompt"],
        "properties": {
            "model": _MODEL,
            "prompt": {"type": "string", "minLength": 1},
            "n": {"type": "integer", "minimum": 1, "maximum": 10},
            "size": {"type": "string", "pattern": "^[0-9]+x[0-9]+$"},
            "response_format": {"type": "string", "enum": ["b64_json", "url"]},
        },
    },
    "DetectionRequest": {
        "type": "object",
        "required": ["model", "image"],
        "properties": {
            "model": _MODEL,
            "image": {"type": "string", "description": "Base64 image (PNG/JPEG), or a data URL."},
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

_MULTIPART_ASR = {
    "type": "object",
    "required": ["model", "file"],
    "properties": {
        "model": _MODEL,
        "file": {"type": "string", "format": "binary"},
        "response_format": {"type": "string"},
        "language": {"type": "string"},
    },
}

_OLLAMA_ERR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string"}},
}
_KEEP_ALIVE = {
    "oneOf": [{"type": "number"}, {"type": "string"}],
    "description": "Idle time the service stays loaded: seconds or a duration ('5m', '1h'); "
    "0 unloads when idle, negative keeps it until memory is needed.",
}
_OLLAMA_OPTIONS = {
    "type": "object",
    "description": "temperature, top_p, seed, stop, num_predict and the three penalties are used; "
    "others are ignored.",
}
OLLAMA_SCHEMAS: dict[str, Any] = {
    "OllamaChatRequest": {
        "type": "object",
        "required": ["model"],
        "properties": {
            "model": _MODEL,
            "messages": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["role"],
                    "properties": {
                        "role": {"type": "string", "minLength": 1},
                        "content": {"type": "string"},
                        "tool_calls": {"type": "array", "items": {"type": "object"}},
                        "tool_name": {"type": "string"},
                    },
                },
            },
            "tools": {"type": "array", "items": {"type": "object"}},
            "format": {"oneOf": [{"type": "string", "enum": ["json"]}, {"type": "object"}]},
            "options": _OLLAMA_OPTIONS,
            "stream": {"type": "boolean", "default": True},
            "keep_alive": _KEEP_ALIVE,
        },
    },
    "OllamaGenerateRequest": {
        "type": "object",
        "required": ["model"],
        "properties": {
            "model": _MODEL,
            "prompt": {"type": "string", "description": "Empty: only load (or unload)."},
            "system": {"type": "string"},
            "raw": {"type": "boolean"},
            "format": {"oneOf": [{"type": "string", "enum": ["json"]}, {"type": "object"}]},
            "options": _OLLAMA_OPTIONS,
            "stream": {"type": "boolean", "default": True},
            "keep_alive": _KEEP_ALIVE,
        },
    },
    "OllamaEmbedRequest": {
        "type": "object",
        "required": ["model", "input"],
        "properties": {
            "model": _MODEL,
            "input": {
                "oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]
            },
            "keep_alive": _KEEP_ALIVE,
        },
    },
    "OllamaEmbeddingsRequest": {
        "type": "object",
        "required": ["model", "prompt"],
        "properties": {"model": _MODEL, "prompt": {"type": "string"}, "keep_alive": _KEEP_ALIVE},
    },
    "OllamaShowRequest": {
        "type": "object",
        "required": ["model"],
        "properties": {"model": _MODEL},
    },
    "OllamaError": _OLLAMA_ERR,
}


def _ollama_op(summary: str, schema: str, *, stream: bool = False) -> dict[str, Any]:
    ok: dict[str, Any] = {"description": "OK", "content": {"application/json": _OBJ}}
    if stream:
        ok["content"]["application/x-ndjson"] = {"schema": {"type": "string"}}
    err = {"application/json": {"schema": {"$ref": "#/components/schemas/OllamaError"}}}
    return {
        "summary": summary,
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
        },
        "responses": {
            "200": ok,
            "400": {"description": "A field is invalid.", "content": err},
            "401": ERRORS["401"],
            "404": {"description": "Unknown model.", "content": err},
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
                "Ollama chat (NDJSON unless stream=false); no messages: load or unload.",
                "OllamaChatRequest",
                stream=True,
            )
        },
        "/api/generate": {
            "post": _ollama_op(
                "Ollama generate (NDJSON unless stream=false); empty prompt: load or unload.",
                "OllamaGenerateRequest",
                stream=True,
            )
        },
        "/api/embed": {"post": _ollama_op("Ollama embeddings (a batch).", "OllamaEmbedRequest")},
        "/api/embeddings": {
            "post": _ollama_op("Ollama embedding (one, legacy).", "OllamaEmbeddingsRequest")
        },
        "/api/show": {"post": _ollama_op("Model details and capabilities.", "OllamaShowRequest")},
        "/api/tags": _ollama_get("The LLM and embedding models (every name and alias)."),
        "/api/ps": _ollama_get(
            "Loaded models: resident size, size on a GPU, when the idle TTL unloads them."
        ),
        "/api/version": _ollama_get("The Ollama API version these shapes follow."),
    }


_JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}

_ADMIN_ERR = {"401": _err("Missing or invalid admin key."), "403": _err("Admin key required.")}


def document() -> dict[str, Any]:
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
                "Chat completion (SSE with stream=true).", "ChatRequest", _OBJ, stream=True
            )
        },
        "/v1/completions": {
            "post": _json_op(
                "Text completion (SSE with stream=true).", "CompletionRequest", _OBJ, stream=True
            )
        },
        "/v1/embeddings": {"post": _json_op("Embeddings.", "EmbeddingsRequest", _OBJ)},
        "/v1/audio/speech": {
            "post": {
                **_json_op("Text to speech.", "SpeechRequest", _OBJ),
                "responses": {
                    "200": {
                        "description": "Audio",
                        "content": {
                            "audio/wav": {"schema": {"type": "string", "format": "binary"}}
                        },
                    },
                    **ERRORS,
                },
            }
        },
        "/v1/images/generations": {"post": _json_op("Image generation.", "ImageRequest", _OBJ)},
        "/v1/audio/transcriptions": {
            "post": {
                "summary": "Speech to text (multipart upload).",
                "requestBody": {
                    "required": True,
                    "content": {"multipart/form-data": {"schema": _MULTIPART_ASR}},
                },
                "responses": {
                    "200": {"description": "OK", "content": {"application/json": _OBJ}},
                    **ERRORS,
                },
            }
        },
        "/v1/detections": {
            "post": {
                "summary": "Object detection: an image in, boxes with labels and scores out. "
                "JSON with a base64 'image', or multipart with an 'image' file.",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {"$ref": "#/components/schemas/DetectionRequest"}
                        },
                        "multipart/form-data": {
                            "schema": {
                                "type": "object",
                                "required": ["model", "image"],
                                "properties": {
                                    "model": _MODEL,
                                    "image": {"type": "string", "format": "binary"},
                                },
                            }
                        },
                    },
                },
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
                        "content": {"text/event-stream": {"schema": {"type": "string"}}},
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
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["model", "inputs"],
                                "properties": {
                                    "model": _MODEL,
                                    "inputs": {
                                        "type": "array",
                                        "minItems": 1,
                                        "items": {"type": "string"},
                                    },
                                    "metadata": {
                                        "type": "object",
                                        "additionalProperties": {"type": "string"},
                                    },
                                },
                            }
                        }
                    },
                },
                "responses": {
                    "200": {"description": "The job", "content": {"application/json": _OBJ}},
                    "400": ERRORS["400"],
                    "401": ERRORS["401"],
                    "413": ERRORS["413"],
                    "415": _err("Unsupported content type."),
                },
            },
            "get": {
                "summary": "Jobs, newest first.",
                "parameters": [
                    {"name": "limit", "in": "query", "schema": {"type": "integer"}},
                    {"name": "after", "in": "query", "schema": {"type": "string"}},
                ],
                "responses": {
                    "200": {"description": "OK", "content": {"application/json": _OBJ}},
                    "400": ERRORS["400"],
                    "401": ERRORS["401"],
                },
            },
        },
        "/v1/jobs/{job_id}": {
            "get": {
                "summary": "One job.",
                "parameters": [_JOB_ID],
                "responses": {
                    "200": {"description": "OK", "content": {"application/json": _OBJ}},
                    "404": _err("No such job."),
                    "401": ERRORS["401"],
                },
            }
        },
        "/v1/jobs/{job_id}/results": {
            "get": {
                "summary": "Results by input index (paged).",
                "parameters": [
                    _JOB_ID,
                    {"name": "offset", "in": "query", "schema": {"type": "integer"}},
                    {"name": "limit", "in": "query", "schema": {"type": "integer"}},
                ],
                "responses": {
                    "200": {"description": "OK", "content": {"application/json": _OBJ}},
                    "400": ERRORS["400"],
                    "404": _err("No such job."),
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
                    "404": _err("No such job."),
                    "409": _err("The job already finished."),
                    "401": ERRORS["401"],
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
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "accelmux",
            "version": __version__,
            "description": "One gateway and resource manager for a home server's accelerator: "
            "OpenAI-compatible inference endpoints and an admin API.",
        },
        "paths": paths,
        "components": {
            "schemas": {**SCHEMAS, **OLLAMA_SCHEMAS},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
