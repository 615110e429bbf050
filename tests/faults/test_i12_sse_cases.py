"""Issue 12, cases from public reports: SSE passed through byte for byte; a stream cut by a reset.

1. A replica streams with CRLF line endings (and, separately, bare CR, which
   the SSE specification also allows), ``data:{`` without a space and
   ``: ping`` comment lines, ending with a usage chunk of 20 prompt / 7
   completion tokens: the client gets identical bytes (before: CRLF was
   rewritten to LF, and bare CR ended the stream with an error); audit and
   ledger see 20 / 7.
2. The replica sends two SSE chunks and then resets the connection: the
   client gets both chunks, then an error event, no ``[DONE]``, no retry; the
   ledger charges what was relayed, and the audit event records the tokens
   relayed and the error code (before: it had neither). A reset before any
   byte is retried on another replica without the client noticing.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import httpx
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from i12_scripted import (TWO_CHUNKS, CapturingLog, Scripted, chunk_obj, event, odd_stream,  # noqa: E402
                          USAGE_20_7)
from test_i12_ledger import (P, audit_hub, body, capture_log, config_overrides, last_event,  # noqa: E402,F401
                             n_replicas, scr)

EOLS = {"crlf": b"\r\n", "cr": b"\r", "lf": b"\n"}


async def _stream(stack: Any, payload: dict[str, Any], *, on_piece: Any = None) -> tuple[int, bytes]:
    got = b""
    async with httpx.AsyncClient(base_url=stack.url, timeout=10) as client:
        async with client.stream("POST", "/v1/completions", json=payload, headers=stack.auth()) as resp:
            async for piece in resp.aiter_raw():
                got += piece
                if on_piece is not None:
                    on_piece(got)
            return resp.status_code, got


@pytest.mark.parametrize("eol", list(EOLS), ids=list(EOLS))
async def test_stream_reaches_the_client_byte_for_byte(stack: Any, scr: Scripted, until: Any,
                                                       capture_log: CapturingLog, eol: str) -> None:
    scr.stream_bytes = odd_stream(EOLS[eol])
    status, got = await _stream(stack, body("bytes", stream=True, stream_options={"include_usage": True}))
    assert status == 200
    assert got == scr.stream_bytes  # identical bytes: line endings, comments, "data:{" untouched
    ev = await last_event(capture_log, 0, until)
    assert ev.outcome.value == "allowed" and ev.error_code is None
    assert ev.output_tokens == 7
    assert (ev.ledger.prompt_charged, ev.ledger.output_charged, ev.ledger.basis) == (20, 7, "usage")
    assert ev.ledger.output_relayed == 3
    totals = stack.components.ledger.totals()["tenant-a"]
    assert totals.charged == {"prompt": 20, "output": 7}


@pytest.mark.parametrize("eol", list(EOLS), ids=list(EOLS))
async def test_usage_chunk_the_gateway_asked_for_is_cut_out_exactly(stack: Any, scr: Scripted, until: Any,
                                                                    capture_log: CapturingLog, eol: str) -> None:
    e = EOLS[eol]
    scr.stream_bytes = odd_stream(e)
    usage_event = event(chunk_obj("", usage=USAGE_20_7, choices=False), space=False, eol=e)
    assert scr.stream_bytes.count(usage_event) == 1
    status, got = await _stream(stack, body("bytes", stream=True))  # the client did not ask for usage
    assert status == 200
    assert got == scr.stream_bytes.replace(usage_event, b"")
    ev = await last_event(capture_log, 0, until)
    assert (ev.ledger.prompt_charged, ev.ledger.output_charged) == (20, 7)


async def test_reset_after_two_chunks_ends_with_an_error_event_and_is_charged_as_relayed(
        stack: Any, scr: Scripted, until: Any, capture_log: CapturingLog) -> None:
    def cut_when_both_arrived(got: bytes) -> None:
        if got.startswith(TWO_CHUNKS):
            scr.cut.set()

    status, got = await _stream(stack, body("reset2", stream=True), on_piece=cut_when_both_arrived)
    assert status == 200
    assert got.startswith(TWO_CHUNKS)  # both chunks, unchanged
    rest = got[len(TWO_CHUNKS):]
    assert rest.startswith(b"data: ") and rest.endswith(b"\n\n") and rest.count(b"\n\n") == 1
    err = json.loads(rest[len(b"data: "):].strip())
    assert err["error"]["code"] == "upstream_stream_error"
    assert b"[DONE]" not in got
    assert scr.hits() == 1  # no retry after the first byte
    ev = await last_event(capture_log, 0, until)
    assert ev.error_code == "upstream_stream_error" and ev.outcome.value == "failed"
    assert ev.ledger.output_relayed == 2
    assert (ev.ledger.prompt_charged, ev.ledger.output_charged, ev.ledger.basis) == (P, 2, "relayed")
    assert stack.components.ledger.totals()["tenant-a"].charged == {"prompt": P, "output": 2}


async def test_reset_before_any_byte_is_retried_elsewhere_unnoticed(stack: Any, scr: Scripted, until: Any,
                                                                    capture_log: CapturingLog) -> None:
    scr.resets_left = 1
    status, got = await _stream(stack, body("reset0", stream=True, stream_options={"include_usage": True}))
    assert status == 200
    assert got == odd_stream(b"\n")  # the whole answer of the second replica, as it sent it
    assert scr.hits() == 2 and scr.resets_left == 0
    assert all(r.hits == 1 for r in scr.replicas)  # retried on the other replica
    ev = await last_event(capture_log, 0, until)
    assert ev.outcome.value == "allowed" and ev.error_code is None
    assert (ev.ledger.prompt_charged, ev.ledger.output_charged, ev.ledger.basis) == (20, 7, "usage")
