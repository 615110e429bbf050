"""Refuse content-coded request bodies (review R9-4).

The gateway reads a request body as it arrives (identity): it does not decompress, so a
``Content-Encoding: gzip`` (or ``deflate``, ``br``, ``zstd``, anything) body was read as its raw bytes
— a gzipped body failed as "not valid UTF-8", a plain JSON body labelled ``br`` was served — while a
WAF or proxy in front that honours the coding (inflates before inspecting) saw other bytes, and the
audit's ``prompt_bytes`` would be of the coded bytes. RFC 9110 section 8.4.1: a server that does not
support a request's content coding ought to answer 415; section 15.5.16: with ``Accept-Encoding``
naming what it would accept.

:func:`refuse_content_coding` (called by gateway/request.py ``read_body`` before any body byte is
read, so after authentication and admission, and audited like the pipeline's other refusals) raises
**415** ``unsupported_content_encoding`` with ``Accept-Encoding: identity`` for any coding other
than ``identity`` (case-insensitive; an empty field counts as none). The framing guard
(gateway/framing.py) then drains a small unread body or closes the connection, as for a 413. No
decompression ever happens here (no zip-bomb surface). The admin listener applies the same rule to
every operator request (policy, data and registry uploads included) in its gate, after the operator
check (gateway/admin.py ``Admin.authenticate_operator``, session 10).
"""

from __future__ import annotations

from collections.abc import Iterable

from gateway.errors import GatewayError

__all__ = ["CODE", "content_coding_problem", "refuse_content_coding"]

CODE = "unsupported_content_encoding"
_NONE = (b"", b"identity")


def content_coding_problem(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The first content coding other than ``identity`` in ``headers`` (an ASGI scope's list of
    (lower-case name, raw value) pairs; every ``Content-Encoding`` field, comma-separated codings),
    lower-cased, or None. One pass over the fields: a comparison per field."""
    for name, value in headers:
        if name == b"content-encoding":
            for coding in value.split(b","):
                coding = coding.strip().lower()
                if coding not in _NONE:
                    return coding
    return None


def refuse_content_coding(headers: Iterable[tuple[bytes, bytes]]) -> None:
    """Raise :class:`GatewayError` 415 ``unsupported_content_encoding`` (``Accept-Encoding: identity``)
    when :func:`content_coding_problem` finds a coding (the coding is not echoed)."""
    if content_coding_problem(headers) is not None:
        raise GatewayError(415, CODE, "request bodies must not be content-coded: send them uncompressed "
                                      "(Content-Encoding: identity or none)", headers={"Accept-Encoding": "identity"})
