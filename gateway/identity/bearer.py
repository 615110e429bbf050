"""Refusing a bearer credential: the reasons, the error, and the RFC 6750 answer.

:class:`Reason` names which check refused a credential;
:class:`AuthenticationError` carries it with the HTTP status and RFC 6750
error code; :func:`www_authenticate` and :func:`error_body` turn it into the
``WWW-Authenticate: Bearer`` header (RFC 6750 3) and the OpenAI-style JSON
body; :func:`extract_bearer` takes the token out of an ``Authorization``
header value. Nothing here looks inside a token.
"""

from __future__ import annotations

import enum
from typing import Any

REALM = "prefixgate"


class Reason(enum.StrEnum):
    """Which check refused a credential (stable strings, safe to log and return)."""

    MISSING_TOKEN = "missing_token"
    MALFORMED_HEADER = "malformed_authorization_header"
    TOKEN_TOO_LARGE = "token_too_large"
    MALFORMED = "malformed"
    ALG_NOT_ALLOWED = "alg_not_allowed"
    UNKNOWN_KID = "unknown_kid"
    BAD_SIGNATURE = "bad_signature"
    EXPIRED = "expired"
    NOT_YET_VALID = "not_yet_valid"
    AUDIENCE = "audience"
    MISSING_CLAIM = "missing_claim"
    BAD_SPIFFE_ID = "bad_spiffe_id"
    FOREIGN_TRUST_DOMAIN = "foreign_trust_domain"
    LIFETIME_TOO_LONG = "lifetime_too_long"
    CRIT_HEADER = "crit_header"
    BAD_TYP = "bad_typ"
    BUNDLE_UNAVAILABLE = "bundle_unavailable"
    IDENTITY_MISMATCH = "identity_mismatch"
    INVALID_FORWARDED_CERT = "invalid_forwarded_certificate"


#: RFC 6750 error code per reason ("" = no error attribute, RFC 6750 3.1:
#: a request without credentials gets a bare challenge).
_CODE: dict[Reason, str] = {
    Reason.MISSING_TOKEN: "",
    Reason.MALFORMED_HEADER: "invalid_request",
}
#: HTTP status per reason; default 401.
_STATUS: dict[Reason, int] = {
    Reason.MALFORMED_HEADER: 400,
    Reason.BUNDLE_UNAVAILABLE: 503,
}


class AuthenticationError(Exception):
    """A credential was refused.

    ``code``: RFC 6750 error code (``invalid_token``, ``invalid_request`` or
    ``""`` for a missing token); ``reason``: a :class:`Reason`;
    ``description``: human text that never contains the token or claims
    values beyond the check that failed; ``status``: HTTP status to answer
    (401; 400 for a malformed Authorization header; 503 when the trust
    bundle is unavailable, which is still a refusal: fail closed).
    """

    def __init__(self, reason: Reason, description: str, *, signature_checked: bool = False) -> None:
        super().__init__(f"{reason.value}: {description}")
        self.reason = reason
        self.code = _CODE.get(reason, "invalid_token")
        self.description = description
        self.status = _STATUS.get(reason, 401)
        #: True when the refusal came from a signature verification (the costly
        #: step): only such refusals count against the caller's source.
        self.signature_checked = signature_checked


def _fail(reason: Reason, description: str, *, signature_checked: bool = False) -> AuthenticationError:
    return AuthenticationError(reason, description, signature_checked=signature_checked)


def _quote(s: str) -> str:
    # RFC 6750 3: error_description is %x20-21 / %x23-5B / %x5D-7E.
    return "".join(c for c in s if 0x20 <= ord(c) <= 0x7E and c not in '"\\')


def www_authenticate(err: AuthenticationError | None = None) -> str:
    """The ``WWW-Authenticate`` header value for a refusal (RFC 6750 3).

    ``Bearer realm="prefixgate", error="invalid_token", error_description="..."``;
    just ``Bearer realm="prefixgate"`` when ``err`` is ``None`` or the token
    was missing.
    """
    value = f'Bearer realm="{REALM}"'
    if err is not None and err.code:
        value += f', error="{err.code}", error_description="{_quote(err.description)}"'
    return value


def error_body(err: AuthenticationError) -> dict[str, Any]:
    """OpenAI-style JSON error body: ``{"error": {"message", "type", "code"}}``.

    ``type`` is ``"authentication_error"`` (``"service_unavailable"`` for
    503); ``code`` is the :class:`Reason` value. Never echoes the token.
    """
    kind = "service_unavailable" if err.status == 503 else "authentication_error"
    return {"error": {"message": err.description, "type": kind, "code": err.reason.value}}


def extract_bearer(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header value.

    Raises :class:`AuthenticationError` with ``missing_token`` (401, bare
    challenge, RFC 6750 3.1) when absent, empty, or the ``Bearer`` scheme with
    an empty credential (``"Bearer"``, ``"Bearer "``: HTTP servers strip the
    trailing space, so both are the same request without credentials);
    ``malformed_authorization_header`` (400) for another scheme or shape.
    The scheme is case-insensitive (RFC 6750 2.1, RFC 9110 11.1).
    """
    value = "" if authorization is None else authorization.strip()
    # ``lower()`` never shortens a string: only a value of at most 6 characters can lower to "bearer"
    # (session 9: the whole token is no longer lowered and stripped three times per request)
    if not value or (len(value) <= 6 and value.lower() == "bearer"):
        raise _fail(Reason.MISSING_TOKEN, "no bearer token")
    parts = value.split(" ")
    if len(parts) != 2 or parts[0].lower() != "bearer" or not parts[1]:
        raise _fail(Reason.MALFORMED_HEADER, "expected 'Authorization: Bearer <JWT-SVID>'")
    return parts[1]
