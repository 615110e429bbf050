"""OpenAI-style error answers of the gateway.

Every refusal is a :class:`GatewayError` carrying the HTTP status, an
OpenAI-compatible ``type`` and a stable machine-readable ``code``; the body is
``{"error": {"message", "type", "code", "param"}}`` plus, for policy answers,
``decision_id``. Messages never echo request content, tokens or keys.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

__all__ = ["GatewayError"]


class GatewayError(Exception):
    """A request refused or failed with a defined HTTP answer.

    ``status``: HTTP status code; ``code``: stable snake_case reason code;
    ``message``: human text safe to show the client; ``err_type``: OpenAI
    error type (``invalid_request_error``, ``authentication_error``,
    ``permission_error``, ``rate_limit_error``, ``server_error``…);
    ``headers``: extra response headers (``Retry-After``, ``WWW-Authenticate``);
    ``extra``: extra top-level fields of the error object (e.g. ``decision_id``).
    ``outcome``: the audit outcome this refusal records; ``record``: fields of the
    request's :class:`gateway.record.RequestRecord` this refusal sets for its audit event
    (e.g. flow control's queue figures: ``queue_wait_ms``, ``virtual_tokens``, ``reason``),
    never sent to the client.
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        err_type: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
        outcome: str | None = None,
        record: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.err_type = err_type or _default_type(status)
        self.param = param
        self.headers = headers or {}
        self.extra = extra or {}
        self.outcome = outcome or _default_outcome(status)
        self.record = record or {}

    def body(self) -> dict[str, Any]:
        """Return the OpenAI-style error body (a JSON-serialisable dict)."""
        err: dict[str, Any] = {"message": self.message, "type": self.err_type, "code": self.code, "param": self.param}
        err.update(self.extra)
        return {"error": err}

    def response(self) -> JSONResponse:
        """Return the Starlette response for this error."""
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def _default_type(status: int) -> str:
    return {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "invalid_request_error",  # as OpenAI answers an unknown model
        408: "invalid_request_error",
        413: "invalid_request_error",
        415: "invalid_request_error",
        429: "rate_limit_error",
    }.get(status, "server_error" if status >= 500 else "invalid_request_error")


def _default_outcome(status: int) -> str:
    if status == 401:
        return "unauthenticated"
    if status == 403:
        return "denied"
    if status == 429:
        return "rate_limited"
    if 400 <= status < 500:
        return "rejected"
    return "failed"
