"""What the schemathesis run over ``/openapi.json`` is told beyond the document
(``SCHEMATHESIS_HOOKS=tests.reliability.schema_hooks``), each because JSON Schema cannot
say it, and each named in docs/security.md:

- the format ``base64-image`` (a base64 image file, how ``/v1/detections`` takes one in
  JSON) and what a WAV file is (as it knows PNG and JPEG): small real files of those
  kinds, since the gateway checks a file's signature and an image's size;
- a named ``tool_choice`` names one of the request's ``tools`` (the field's description
  says so; a JSON schema cannot compare two values);
- a multipart body's required ``model`` is never the empty string (schemathesis fills
  required form fields that way when the files have media-type strategies);
- positive data is accepted when the answer is a 413 ``too_large`` (the request can
  never fit this machine's memory) or a 400 ``unsupported`` (the backend serving that
  model cannot do what was asked: a dimension count, an audio format) or a 422
  ``plan_refused`` (a plan asked of a history too short to plan from): answers about
  the machine, the backend and the daemon's record, not about the request's shape,
  which the document describes; and a 400 naming a multipart file whose bytes are not
  of the media type they were sent as. Every other check runs as schemathesis ships it.
"""

from __future__ import annotations

import io
import json
import wave
from typing import Any

import schemathesis
from hypothesis import strategies as st
from schemathesis.checks import positive_data_acceptance
from schemathesis.core import file_samples
from schemathesis.core.failures import Failure

from accelmux.gateway.openai_requests import IMAGE_BASE64, TINY_PNG_B64

#: Answers that describe this machine, its backends or its record rather than the request.
CAPACITY_ANSWERS = {(413, "too_large"), (400, "unsupported"), (422, "plan_refused")}
#: The file fields of the multipart forms: the document gives their media types, but
#: bytes that claim a type without being of it (a one-byte "JPEG") are refused by name.
FILE_FIELDS = {"file", "image"}


def _wav(seconds: float) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\x00\x00" * int(16000 * seconds))
    return out.getvalue()


schemathesis.openapi.format(
    IMAGE_BASE64,
    st.sampled_from([TINY_PNG_B64, "data:image/png;base64," + TINY_PNG_B64]),
)
# A WAV file joins the files schemathesis already sends for the image types it knows (a
# media-type strategy instead would make it fill the form's other fields with "").
file_samples.MEDIA_TYPE_FILE_SAMPLES.setdefault("audio/wav", _wav(0.2))


def _form_model(context: Any, body: dict[str, Any]) -> None:
    """A multipart body's ``model`` one the document names: given media-type strategies
    for its files, schemathesis fills the form's other required fields with an empty
    string, which its own schema refuses."""
    if body.get("model") != "":
        return
    content = context.operation.definition.raw.get("requestBody", {}).get("content", {})
    for media in content.values():
        names = media.get("schema", {}).get("properties", {}).get("model", {}).get("enum")
        if names:
            body["model"] = names[0]
            return


def _tool_choice(body: dict[str, Any]) -> None:
    """A named ``tool_choice`` names the first tool (when there is one to name)."""
    choice, tools = body.get("tool_choice"), body.get("tools")
    if not (isinstance(choice, dict) and isinstance(tools, list) and tools):
        return
    first = tools[0].get("function") if isinstance(tools[0], dict) else None
    fn = choice.get("function")
    if isinstance(first, dict) and isinstance(first.get("name"), str) and isinstance(fn, dict):
        fn["name"] = first["name"]


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    """In every phase, before a request goes: the two rules above that the generator
    cannot follow (schemathesis then judges the request as sent)."""
    meta = case.meta
    if meta is not None and not meta.generation.mode.is_positive:
        return  # a request meant to be wrong stays as it was drawn
    if isinstance(case.body, dict):
        _form_model(context, case.body)
        _tool_choice(case.body)


def _error(response: Any) -> tuple[str | None, str | None]:
    """(code, param) of an error answer in OpenAI's shape; Ollama's shape (a message
    only) names a refusal of the Manager by its leading reason (``too_large: ...``)."""
    try:
        error = json.loads(response.content)["error"]
    except (ValueError, KeyError, TypeError):
        return None, None
    if isinstance(error, str):
        return error.partition(":")[0], None
    if isinstance(error, dict):
        return error.get("code"), error.get("param")
    return None, None


def _excused(response: Any, case: Any) -> bool:
    code, param = _error(response)
    if (response.status_code, code) in CAPACITY_ANSWERS:
        return True
    multipart = str(case.media_type or "").startswith("multipart/")
    return multipart and response.status_code == 400 and param in FILE_FIELDS


@schemathesis.check
def positive_data_accepted(ctx: Any, response: Any, case: Any) -> bool | None:
    """schemathesis's ``positive_data_acceptance``, the capacity answers above aside."""
    try:
        return positive_data_acceptance(ctx, response, case)
    except Failure:
        if _excused(response, case):
            return None
        raise
