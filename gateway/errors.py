"""OpenAI-style error answers of the gateway.

Every refusal is a :class:`GatewayError` carrying the HTTP status, an
OpenAI-compatible ``type`` and a stable machine-readable ``code``; the body is
``{"error": {"message", "type", "code", "param"}}`` plus, for policy answers,
``decision_id``. Messages never echo request content, tokens or keys.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse, Response

__all__ = ["GatewayError", "StepFailed", "model_not_found"]


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
    never sent to the client. ``client_text``: the message or ``param`` holds text the client sent (a field
    name): its body is rendered for this answer alone, never kept in the process-wide cache of bodies (one
    tenant's text must not make another tenant's answer faster; session 23).
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
        client_text: bool = False,
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
        self.client_text = client_text

    def body(self) -> dict[str, Any]:
        """Return the OpenAI-style error body (a JSON-serialisable dict)."""
        err: dict[str, Any] = {"message": self.message, "type": self.err_type, "code": self.code, "param": self.param}
        err.update(self.extra)
        return {"error": err}

    def response(self) -> Response:
        """Return the Starlette response for this error (``application/json``). The body of an
        error without ``extra`` fields is rendered once and reused (a flood of the same 429
        costs no JSON encoding per request; not one with ``client_text``); the bytes are exactly :class:`JSONResponse`'s."""
        if self.extra or self.client_text:
            return JSONResponse(self.body(), status_code=self.status, headers=self.headers)
        key = (self.code, self.message, self.err_type, self.param)
        content = _BODIES.get(key)
        if content is None:
            content = JSONResponse(self.body()).body
            if len(_BODIES) >= _BODIES_MAX:
                _BODIES.clear()
            _BODIES[key] = content
        return Response(content, status_code=self.status, headers=self.headers, media_type="application/json")


#: rendered bodies of errors without ``extra`` fields, by (code, message, type, param); bounded
_BODIES: dict[tuple[str, str, str, str | None], bytes] = {}
_BODIES_MAX = 1024


class StepFailed(Exception):
    """A bug (an exception that is not a :class:`GatewayError`) inside a pipeline step that had learnt
    record fields before it, raised ``from`` the bug (its ``__cause__``, logged with it): ``record`` holds
    those fields (names of :class:`gateway.record.RequestRecord` fields), which the 500 ``internal_error``'s
    audit record keeps (:meth:`gateway.record.RequestRecord.failed`; session 20, S19-T4-1), as a
    :class:`GatewayError`'s ``record`` does for a refusal. The message is fixed: never request content."""

    def __init__(self, record: dict[str, Any]) -> None:
        super().__init__("a bug inside a request step (its cause follows)")
        self.record = record


def model_not_found(*, record: dict[str, Any] | None = None, outcome: str | None = None) -> GatewayError:
    """The one 404 ``model_not_found`` answer (param ``model``) for a model the gateway does not
    serve and for one the tenant is not entitled to (R3-7): the client's body is the same;
    ``record``/``outcome`` (audit only) say which."""
    return GatewayError(404, "model_not_found", "the requested model does not exist", param="model",
                        record=record, outcome=outcome)


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
