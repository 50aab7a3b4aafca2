"""HTTP API of batch jobs, mounted under ``/v1/jobs``.

Endpoints::

    POST /v1/jobs                      create a job; answers the job object
         application/json body:  {"model": "embed", "inputs": ["text", ...],
                                  "metadata": {"key": "value"}}      (metadata optional)
         JSON-lines body (Content-Type application/jsonl, application/x-ndjson or
         application/jsonlines), model in the query (?model=embed): one input per line,
         each a JSON string or {"input": "text"}; blank lines are skipped
    GET  /v1/jobs?limit=20&after=ID    jobs newest first: {"object": "list", "data": [...],
                                       "first_id", "last_id", "has_more"}
    GET  /v1/jobs/{id}                 the job object
    GET  /v1/jobs/{id}/results?offset=0&limit=100
                                       one item per input, by input index:
                                       {"object": "list", "job_id", "data": [{"index",
                                       "status", "attempts", "result", "error"}], "offset",
                                       "limit", "total", "has_more", "next_offset"}
    POST /v1/jobs/{id}/cancel          cancel; answers the job object (409 when it had
                                       already completed or failed; a no-op when cancelled)

The job object::

    {"id": "job_...", "object": "job", "model": "embed", "status": "running",
     "created_at": 1764500000, "started_at": ..., "finished_at": null, "max_attempts": 5,
     "request_counts": {"total": 10, "completed": 4, "failed": 0, "cancelled": 0,
                        "pending": 4, "in_progress": 2},
     "metadata": {}, "error": null}

Job status: ``queued`` (nothing started) -> ``running`` -> ``completed`` (every input
ended and at least one succeeded; failures are counted) or ``failed`` (every input
failed); ``paused`` while the model is outside its maintenance window; ``cancelled``.
Item status: ``pending``, ``in_progress``, ``completed`` (``result`` set), ``failed``
(``error`` set), ``cancelled``. Timestamps are Unix seconds.

Errors use OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, with
``param`` naming the offending field (``inputs[3]`` for one input). 400: invalid body or
query; 404: no such job; 409: cancel of a finished job; 413: body too large; 415: other
content types.

Modelled on OpenAI's batch API, but simpler: no separate file upload (inputs come inline
or as a JSON-lines body), each input is a plain string for one model instead of a full
request line per endpoint, there is no ``completion_window`` (the model's maintenance
window and the Manager decide when work runs), results are paged JSON by input index
instead of an output file, statuses differ (no validating/finalizing/expired; ``paused``
added), and cancel takes effect at once (inputs already in flight finish and keep their
results). Authentication is the gateway's, as for every ``/v1`` route.

Owners: with ``server.api_keys`` set, a job belongs to the key that submitted it (the
store keeps the SHA-256 of the key, never the key). A key lists, reads, pages and
cancels only its own jobs; another key's job answers 404 ``job_not_found``, exactly as a
job that does not exist, so ids do not leak. ``server.admin_key``, sent as a Bearer
token, is accepted on ``/v1/jobs`` (and nowhere else under ``/v1``) and sees every job.
Without API keys jobs have no owner and every caller sees every job. Jobs stored before
owners existed have none: with API keys set, only the admin key sees them.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import re
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from accelmux.jobs.errors import JobNotFoundError, JobStateError
from accelmux.jobs.model import EVERYONE, Job, ResultItem, Viewer
from accelmux.jobs.runner import JobRunner
from accelmux.jobs.store import JOB_ID_PATTERN, JobStore
from accelmux.jobs.submit_request import (
    JobLimits,
    JobSubmitRequest,
    job_error_code,
    limits_context,
)
from accelmux.request_validation import first_problem

log = logging.getLogger("accelmux.jobs")

JSON_LINES_TYPES = ("application/jsonl", "application/x-ndjson", "application/jsonlines")

_ITEM_STATUS = {
    "pending": "pending",
    "leased": "in_progress",
    "done": "completed",
    "failed": "failed",
    "cancelled": "cancelled",
}


class ApiError(Exception):
    """An answer in OpenAI's error shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type_: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type_

    def response(self) -> web.Response:
        body = {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }
        return web.json_response(body, status=self.status)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def key_digest(key: str) -> str:
    """What the store keeps of an API key: its SHA-256, hex."""
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class JobAccess:
    """The gateway's keys, to tell whose jobs a request may see (``server.api_keys``,
    ``server.admin_key``); the gateway has checked the key before a handler runs."""

    api_keys: Sequence[str] = ()
    admin_key: str | None = None

    def viewer(self, request: web.Request) -> Viewer:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        key = token.strip() if scheme.lower() == "bearer" and token.strip() else None
        admin = (self.admin_key or "").encode()
        if key is not None and admin and hmac.compare_digest(key.encode(), admin):
            return Viewer(owner=key_digest(key), sees_all=True)
        if not self.api_keys:
            return EVERYONE  # no keys: jobs have no owner, everyone sees them
        return Viewer(owner=None if key is None else key_digest(key))


def _answers_errors(handler: Handler) -> Handler:
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as exc:
            return exc.response()
        except JobNotFoundError as exc:
            return ApiError(404, str(exc), param="id", code="job_not_found").response()
        except JobStateError as exc:
            return ApiError(409, str(exc), code="invalid_job_status").response()
        except web.HTTPException:
            raise
        except Exception:
            log.exception("jobs API: %s %s failed", request.method, request.path)
            return ApiError(
                500,
                "internal error; see the daemon log",
                type_="server_error",
                code="internal_error",
            ).response()

    return wrapped


def job_routes(
    store: JobStore,
    runner: JobRunner | None,
    *,
    prefix: str = "/v1/jobs",
    limits: JobLimits | None = None,
    models: Callable[[], Collection[str]] | None = None,
    access: JobAccess | None = None,
) -> list[web.RouteDef]:
    """The route table of the jobs API; ``app.add_routes(job_routes(store, runner))``.

    ``models`` (optional) lists the model/service names a job may target; without it any
    name is accepted. ``runner`` is woken when a job is created or cancelled. ``access``
    (the gateway's keys) decides whose jobs a caller sees; without it, no keys.
    """
    api = _JobsApi(store, runner, limits or JobLimits(), models, access or JobAccess())
    return [
        web.post(prefix, _answers_errors(api.create)),
        web.get(prefix, _answers_errors(api.list_jobs)),
        web.get(prefix + "/{job_id}", _answers_errors(api.show)),
        web.get(prefix + "/{job_id}/results", _answers_errors(api.results)),
        web.post(prefix + "/{job_id}/cancel", _answers_errors(api.cancel)),
    ]


class _JobsApi:
    def __init__(
        self,
        store: JobStore,
        runner: JobRunner | None,
        limits: JobLimits,
        models: Callable[[], Collection[str]] | None,
        access: JobAccess,
    ) -> None:
        self.store = store
        self.runner = runner
        self.limits = limits
        self.models = models
        self.access = access

    def _wake(self) -> None:
        if self.runner is not None:
            self.runner.wake()

    async def create(self, request: web.Request) -> web.StreamResponse:
        body = await _read_body(request, self.limits.max_body_bytes)
        content_type = request.content_type
        if content_type in JSON_LINES_TYPES:
            query_model = request.query.get("model")
            submit = await asyncio.to_thread(_parse_json_lines, body, query_model, self.limits)
        elif content_type in ("application/json", "application/octet-stream", ""):
            submit = await asyncio.to_thread(_parse_json_body, body, self.limits)
        else:
            raise ApiError(
                415,
                f"unsupported Content-Type {content_type!r}; use application/json or "
                "application/jsonl",
                code="unsupported_media_type",
            )
        model = self._check_model(submit.model)
        metadata = submit.metadata or {}
        owner = self.access.viewer(request).owner if self.access.api_keys else None
        job = await asyncio.to_thread(
            self.store.create_job, model, submit.inputs, metadata=metadata, owner=owner
        )
        self._wake()
        return web.json_response(job_json(job))

    def _check_model(self, model: str) -> str:
        if self.models is not None:
            known = self.models()
            if model not in known:
                names = ", ".join(sorted(known)) or "none"
                raise ApiError(
                    400,
                    f"unknown model {model!r} (known: {names})",
                    param="model",
                    code="model_not_found",
                )
        return model

    async def list_jobs(self, request: web.Request) -> web.StreamResponse:
        limit = _int_query(request, "limit", 20, 1, self.limits.max_list)
        after = request.query.get("after")
        if after is not None and not re.fullmatch(JOB_ID_PATTERN, after):
            raise ApiError(
                400,
                f"after must be a job id (job_...), not {after!r}",
                param="after",
                code="invalid_value",
            )
        try:
            jobs, has_more = await asyncio.to_thread(
                self.store.list_jobs, limit=limit, after=after, viewer=self.access.viewer(request)
            )
        except JobNotFoundError as exc:
            raise ApiError(404, str(exc), param="after", code="job_not_found") from None
        body = {
            "object": "list",
            "data": [job_json(job) for job in jobs],
            "first_id": jobs[0].id if jobs else None,
            "last_id": jobs[-1].id if jobs else None,
            "has_more": has_more,
        }
        return web.json_response(body)

    async def show(self, request: web.Request) -> web.StreamResponse:
        viewer = self.access.viewer(request)
        job = await asyncio.to_thread(
            self.store.get_job, request.match_info["job_id"], viewer=viewer
        )
        return web.json_response(job_json(job))

    async def results(self, request: web.Request) -> web.StreamResponse:
        job_id = request.match_info["job_id"]
        offset = _int_query(request, "offset", 0, 0, None)
        limit = _int_query(request, "limit", self.limits.default_page, 1, self.limits.max_page)
        viewer = self.access.viewer(request)
        job = await asyncio.to_thread(self.store.get_job, job_id, viewer=viewer)
        items = await asyncio.to_thread(
            self.store.results, job_id, offset=offset, limit=limit, viewer=viewer
        )
        end = offset + len(items)
        has_more = end < job.counts.total
        body = {
            "object": "list",
            "job_id": job_id,
            "data": [result_json(item) for item in items],
            "offset": offset,
            "limit": limit,
            "total": job.counts.total,
            "has_more": has_more,
            "next_offset": end if has_more else None,
        }
        return web.json_response(body)

    async def cancel(self, request: web.Request) -> web.StreamResponse:
        viewer = self.access.viewer(request)
        job = await asyncio.to_thread(
            self.store.cancel_job, request.match_info["job_id"], viewer=viewer
        )
        self._wake()
        return web.json_response(job_json(job))


def job_json(job: Job) -> dict[str, Any]:
    counts = job.counts
    return {
        "id": job.id,
        "object": "job",
        "model": job.model,
        "status": job.status,
        "created_at": int(job.created_at),
        "started_at": None if job.started_at is None else int(job.started_at),
        "finished_at": None if job.finished_at is None else int(job.finished_at),
        "max_attempts": job.max_attempts,
        "request_counts": {
            "total": counts.total,
            "completed": counts.done,
            "failed": counts.failed,
            "cancelled": counts.cancelled,
            "pending": counts.pending,
            "in_progress": counts.leased,
        },
        "metadata": job.metadata,
        "error": job.error,
    }


def result_json(item: ResultItem) -> dict[str, Any]:
    return {
        "index": item.index,
        "status": _ITEM_STATUS[item.state],
        "attempts": item.attempts,
        "result": item.result,
        "error": item.error,
    }


async def _read_body(request: web.Request, limit: int) -> bytes:
    """The whole body, refusing (413) past ``limit`` bytes whatever the app's own limit."""
    too_large = ApiError(413, f"the body is larger than {limit} bytes", code="body_too_large")
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def _validated(
    data: dict[str, Any], limits: JobLimits, lines: list[int] | None = None
) -> JobSubmitRequest:
    """``data`` checked by the request model; ``lines``: the line of each input (a
    JSON-lines body), named in the message."""
    try:
        return JobSubmitRequest.model_validate(data, context=limits_context(limits))
    except ValidationError as exc:
        problem = first_problem(exc)
        message = problem.message
        param = problem.param or ""
        if lines is not None and param.startswith("inputs["):
            index = int(param[len("inputs[") :].partition("]")[0])
            message += f" (line {lines[index]})"
        code = job_error_code(problem.kind)
        raise ApiError(400, message, param=problem.param, code=code) from None


def _parse_json_body(body: bytes, limits: JobLimits) -> JobSubmitRequest:
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:
        raise ApiError(400, "the body nests too deeply", code="json_too_deep") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object", code="invalid_json")
    return _validated(data, limits)


def _parse_json_lines(body: bytes, model: str | None, limits: JobLimits) -> JobSubmitRequest:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "the body is not UTF-8", param="inputs", code="invalid_json") from None
    inputs: list[Any] = []
    lines: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ApiError(
                400, f"line {number} is not valid JSON: {exc}", param="inputs", code="invalid_json"
            ) from None
        except RecursionError:
            raise ApiError(
                400, f"line {number} nests too deeply", param="inputs", code="json_too_deep"
            ) from None
        if isinstance(value, dict) and set(value) == {"input"}:
            value = value["input"]
        inputs.append(value)
        lines.append(number)
        if len(inputs) > limits.max_inputs:  # enough to refuse: read no further
            break
    return _validated({"model": model, "inputs": inputs}, limits, lines)


def _int_query(request: web.Request, name: str, default: int, low: int, high: int | None) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, f"{name} must be an integer", param=name, code="invalid_type") from None
    if value < low or (high is not None and value > high):
        bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ApiError(400, f"{name} must be {bounds}", param=name, code="invalid_value")
    return value
