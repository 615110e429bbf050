"""Unit tests of gateway.sse.SseScanner: bytes forwarded unchanged, split anywhere (issue 12, SSE case)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.event import AuditEvent, Kind, LedgerInfo, Outcome
from audit.ocsf import to_ocsf, validate_ocsf
from gateway.sse import SseProtocolError, SseScanner


def ev(obj: dict, *, space: bool = True, eol: bytes = b"\n") -> bytes:
    return b"data:" + (b" " if space else b"") + json.dumps(obj).encode() + eol + eol


def chunk(text: str) -> dict:
    return {"choices": [{"index": 0, "text": text}]}


USAGE = {"choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 7}}


def stream(eol: bytes) -> tuple[bytes, bytes]:
    """(the whole stream, its usage event)."""
    usage = ev(USAGE, space=False, eol=eol)
    body = (b"\xef\xbb\xbf: ping" + eol + eol + ev(chunk(" a"), space=False, eol=eol) + b": ping" + eol + eol
            + ev({"choices": [{"index": 0, "delta": {"content": "b"}}, {"index": 1, "delta": {"role": "x"}}]},
                 eol=eol)
            + b"id: 7" + eol + b"data: {\"choices\": " + eol + b"data: []}" + eol + eol  # two data lines
            + usage + b"data: [DONE]" + eol + eol)
    return body, usage


def run(sc: SseScanner, data: bytes, cuts: list[int]) -> bytes:
    out, last = b"", 0
    for c in sorted(set(cuts)) + [len(data)]:
        out += sc.feed(data[last:c])
        last = c
    return out + sc.finish()


@settings(max_examples=300, deadline=None)
@given(eol=st.sampled_from([b"\r\n", b"\r", b"\n"]), keep=st.booleans(), cuts=st.lists(st.integers(0, 2000)))
def test_forwarded_bytes_are_the_input_split_anywhere(eol: bytes, keep: bool, cuts: list[int]) -> None:
    data, usage = stream(eol)
    sc = SseScanner(keep_usage_chunk=keep)
    out = run(sc, data, [c % (len(data) + 1) for c in cuts])
    assert out == (data if keep else data.replace(usage, b""))
    assert sc.done and sc.usage == USAGE["usage"] and sc.output_tokens == 2 and sc.events == 4


def test_mixed_line_endings_and_a_crlf_split_across_chunks() -> None:
    data = ev(chunk("x"), eol=b"\r\n") + ev(chunk("y"), eol=b"\r") + ev(chunk("z")) + b"data: [DONE]\r\n\r\n"
    sc = SseScanner(keep_usage_chunk=False)
    cut = data.index(b"\r\n\r\n") + 3  # ...\r\n\r | \ndata: ...
    assert sc.feed(data[:cut]) == ev(chunk("x"), eol=b"\r\n")[:-1]
    assert sc.feed(data[cut:]) + sc.finish() == data[cut:]
    assert sc.output_tokens == 3


def test_dropped_usage_event_takes_its_split_lf_with_it() -> None:
    usage = ev(USAGE, eol=b"\r\n")
    data = ev(chunk("x"), eol=b"\r\n") + usage + b"data: [DONE]\r\n\r\n"
    cut = len(ev(chunk("x"), eol=b"\r\n")) + len(usage) - 1  # after the usage event's last CR
    sc = SseScanner(keep_usage_chunk=False)
    out = sc.feed(data[:cut]) + sc.feed(data[cut:]) + sc.finish()
    assert out == data.replace(usage, b"")


@pytest.mark.parametrize(("data", "message"), [
    (b"data: {not json\n\n", "not JSON"),
    (b"data: [1]\n\n", "not a JSON object"),
    (b'data: {"error": {"message": "x"}}\r\n\r\n', "error event"),
])
def test_broken_events(data: bytes, message: str) -> None:
    with pytest.raises(SseProtocolError, match=message):
        SseScanner().feed(data)


def test_valid_events_before_a_bad_one_are_kept_for_forwarding() -> None:
    good = ev(chunk("x"), eol=b"\r\n")
    sc = SseScanner()
    with pytest.raises(SseProtocolError) as info:
        sc.feed(good + b"data: {oops\r\n\r\n")
    assert info.value.forward == good and sc.output_tokens == 1


def test_end_inside_an_event_or_without_done() -> None:
    sc = SseScanner()
    sc.feed(ev(chunk("x"))[:-2])
    with pytest.raises(SseProtocolError, match="inside an event"):
        sc.finish()
    sc = SseScanner()
    sc.feed(ev(chunk("x")))
    with pytest.raises(SseProtocolError, match="without"):
        sc.finish()


def test_oversized_event() -> None:
    sc = SseScanner(max_event_bytes=100)
    with pytest.raises(SseProtocolError, match="too large"):
        sc.feed(b"data: " + b"x" * 200)


def test_empty_data_dispatches_nothing() -> None:
    sc = SseScanner()
    assert sc.feed(b"data:\n\ndata: [DONE]\n\n") == b"data:\n\ndata: [DONE]\n\n"
    assert sc.events == 0 and sc.done


def test_audit_schema_reads_version_1_events() -> None:
    """A spill file written before the upgrade (schema "1") is still replayed."""
    new = AuditEvent(Kind.INFERENCE, Outcome.FAILED, time_ms=1, event_id="e", error_code="upstream_stream_error",
                     ledger=LedgerInfo(reserved_tokens=66, charged_tokens=52, prompt_charged=50, output_charged=2,
                                       output_relayed=2, basis="relayed"))
    d = new.to_dict()
    assert d["schema_version"] == "6" and d["ledger"]["basis"] == "relayed"
    assert AuditEvent.from_dict(d) == new
    ocsf = to_ocsf(new)
    validate_ocsf(ocsf)
    assert ocsf["unmapped"]["prefixgate"]["ledger"]["charged_tokens"] == 52
    assert ocsf["status_detail"] == "upstream_stream_error"
    old = AuditEvent(Kind.INFERENCE, Outcome.ALLOWED, time_ms=1, event_id="e").to_dict()
    old["schema_version"] = "1"
    assert AuditEvent.from_dict(old).ledger == LedgerInfo()
