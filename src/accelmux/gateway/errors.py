"""OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``.

Status mapping of the Manager's reasons: ``too_large`` -> 413, ``queue_full`` -> 429,
``backend_crashed`` -> 502, every other refusal -> 503; 429/503 carry ``Retry-After``.

A backend's own failure (:func:`backend_failure`): ``backend_crashed`` (502) when its
process died or its model raised with the request in flight (the name the decision log
gives it, whichever the daemon noticed first: the broken request or the process exit),
``backend_error`` (502) for any other failure (a timeout, a load that failed).
"""

from __future__ import annotations

import json
import math

from aiohttp import web

from accelmux.core.types import Reason
from accelmux.errors import BackendCrashedError, BackendError
from accelmux.runtime.requests import Refused


class ApiError(Exception):
    """An error answered in OpenAI's JSON shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
        close: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s
        #: Whether the connection is closed after the answer (a refusal at the door: the
        #: request's body, if any, is not read).
        self.close = close

    def body(self) -> dict[str, object]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def body_bytes(self) -> bytes:
        return json.dumps(self.body()).encode()

    def response(self) -> web.Response:
        headers = {}
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after_s)))
        resp = web.Response(
            status=self.status,
            body=self.body_bytes(),
            content_type="application/json",
            headers=headers,
        )
        if self.close:
            resp.force_close()
        return resp


def bad_field(param: str, message: str) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value")


def backend_failure(exc: BackendError) -> ApiError:
    """The HTTP form of a backend's failure (502, ``Retry-After``)."""
    code = Reason.BACKEND_CRASHED.value if isinstance(exc, BackendCrashedError) else "backend_error"
    return ApiError(502, str(exc), type="backend_error", code=code, retry_after_s=1)


def refusal(exc: Refused, param: str | None = None) -> ApiError:
    """The HTTP form of a Manager's Reject or Fail; ``param``: the request field whose size
    made the demand (named by a 413 ``too_large``)."""
    reason = exc.reason
    detail = exc.action.detail
    message = f"{reason.value}: {detail}" if detail else reason.value
    if reason is Reason.TOO_LARGE:
        if param:
            message += f" ('{param}' makes the request this large)"
        return ApiError(413, message, code=reason.value, param=param)
    if reason is Reason.QUEUE_FULL:
        return ApiError(
            429,
            message,
            type="rate_limit_error",
            code=reason.value,
            retry_after_s=exc.retry_after_s or 1.0,
        )
    if reason is Reason.BACKEND_CRASHED:
        return ApiError(502, message, type="backend_error", code=reason.value, retry_after_s=1.0)
    retry = exc.retry_after_s if exc.retry_after_s is not None else 1.0
    return ApiError(
        503, message, type="service_unavailable", code=reason.value, retry_after_s=retry or 1.0
    )
