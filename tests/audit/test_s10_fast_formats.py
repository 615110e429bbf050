"""Session 10 (issue 14): the audit worker's fast formatters give the reference formatters' output
exactly, on random events (hypothesis) of every kind and outcome, with hostile strings (CEF and
JSON specials, non-ASCII, newlines), missing groups and odd value types:
``audit.cef.cef_line`` == ``format_cef``, ``audit.ocsf.ocsf_line`` == ``orjson.dumps(to_ocsf(...),
OPT_SORT_KEYS)``, the syslog sink's frame == ``format_rfc5424``'s, the spill line reads back to the
same event."""
from __future__ import annotations

import asyncio

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.cef import cef_line, format_cef
from audit.event import AuditEvent, Identity, Kind, Latencies, LedgerInfo, Outcome, PolicyInfo, RouteInfo
from audit.log_spill import encode_line
from audit.ocsf import ocsf_line, to_ocsf
from audit.syslog import SyslogSink, format_rfc5424

_text = st.one_of(st.none(), st.sampled_from(["", "t-a", "a=b", "x|y", "back\\slash", "l1\nl2", "cr\r\nlf", "ü€😀",
                                               "spiffe://d/ns/a", "/v1/completions", "allow", "127.0.0.1"]),
                  st.text(max_size=24))
_num = st.one_of(st.none(), st.integers(-5, 10**12), st.floats(allow_nan=False, allow_infinity=False, width=32),
                 st.booleans())
_details = st.one_of(st.none(), st.just({}), st.dictionaries(st.sampled_from(["alert_kind", "action", "source",
                                                                              "suppressed", "x"]),
                                                             st.one_of(st.integers(0, 9), st.text(max_size=5)),
                                                             max_size=3))


@st.composite
def events(draw: st.DrawFn) -> AuditEvent:
    """Random events: mostly request-shaped (details None), some with details or any kind."""
    kind = draw(st.sampled_from(list(Kind)))
    with_details = draw(st.integers(0, 4)) == 0
    det = (lambda: draw(_details)) if with_details else (lambda: None)
    return AuditEvent(
        kind=kind, outcome=draw(st.sampled_from(list(Outcome))),
        time_ms=draw(st.one_of(st.integers(0, 2**41), st.just(1_764_000_000_123))),
        event_id=draw(st.one_of(st.uuids().map(str), st.text(max_size=12))),
        request_id=draw(_text),
        identity=Identity(draw(_text), draw(_text)), tenant=draw(_text),
        policy=PolicyInfo(draw(_text), draw(_text), draw(_text)), endpoint=draw(_text), model=draw(_text),
        prompt_tokens=draw(_num), output_tokens=draw(_num), sequences=draw(_num),
        ledger=LedgerInfo(draw(_num), draw(_num), None, draw(_num), None, draw(_text)),
        error_code=draw(_text),
        route=RouteInfo(draw(_text), draw(_text), draw(_text), draw(_num), None, draw(_num), draw(_num), draw(_num)),
        latency=Latencies(draw(_num), None, draw(_num), None, None, draw(_num),
                          draw(st.one_of(st.none(), st.floats(0, 1e6))), draw(_num)),
        status_code=draw(_num), client_address=draw(_text), trace_id=draw(_text),
        prefix_fingerprint=draw(_text), operator=det(), alert=det(), summary=det(), checkpoint=det(),
        instance=draw(_text))


@settings(max_examples=400, deadline=None)
@given(events())
def test_cef_line_equals_format_cef(event: AuditEvent) -> None:
    assert cef_line(event) == format_cef(event)
    assert cef_line(event) == format_cef(event)  # from the caches


@settings(max_examples=400, deadline=None)
@given(events())
def test_ocsf_line_equals_to_ocsf(event: AuditEvent) -> None:
    expected = orjson.dumps(to_ocsf(event), option=orjson.OPT_SORT_KEYS)
    assert ocsf_line(event) == expected
    assert ocsf_line(event) == expected


@settings(max_examples=200, deadline=None)
@given(events())
def test_spill_line_reads_back_to_the_event(event: AuditEvent) -> None:
    line = encode_line(event)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert AuditEvent.from_dict(orjson.loads(line)) == AuditEvent.from_dict(event.to_dict())


def test_syslog_frames_equal_format_rfc5424() -> None:
    """The sink's frames (host part made once, the CEF fast twin) are format_rfc5424(format_cef)."""
    sent: list[bytes] = []

    class _W:
        def write(self, data: bytes) -> None:
            sent.append(data)

        async def drain(self) -> None:
            return None

        def is_closing(self) -> bool:
            return False

        class transport:  # noqa: N801 -- StreamWriter.transport (session 29: send asks for the buffer size)
            @staticmethod
            def get_write_buffer_size() -> int:
                return 0

    evs = [AuditEvent(kind=k, outcome=o, event_id=f"e{i}", tenant="t|a", endpoint="/v1\nx", client_address="1.2.3.4",
                      time_ms=1_764_000_000_000 + i)
           for i, (k, o) in enumerate((k, o) for k in Kind for o in Outcome)]
    sink = SyslogSink("127.0.0.1", 9, hostname="host one")

    async def run() -> None:
        async def no_open() -> None:
            return None

        sink.open = no_open  # type: ignore[method-assign]
        sink._writer = _W()  # type: ignore[assignment]
        await sink.send(evs)

    asyncio.run(run())
    expected = b"".join(b"%d %s" % (len(m), m) for m in (format_rfc5424(ev, format_cef(ev), "host one") for ev in evs))
    assert b"".join(sent) == expected


# ---- the request row's scrub check (audit.scrub.row_is_clean)
from audit.request_event import REQUEST_ROW_FIELDS, request_event  # noqa: E402
from audit.scrub import row_is_clean, scrub_event  # noqa: E402

_FP = REQUEST_ROW_FIELDS.index("prefix_fingerprint")
_hostile = st.one_of(st.none(), st.sampled_from([
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig", "Bearer abcdefghijklmnop", "-----BEGIN PRIVATE KEY-----",
    "x" * 257, "ab" * 32, "ABCDEF", "0123abcd", "", "tenant-a", "ü"]), st.text(max_size=40),
    st.integers(-3, 3), st.floats(allow_nan=False), st.booleans(), st.just([1, 2]), st.just({"a": 1}),
    st.just(b"raw"))


@st.composite
def rows(draw: st.DrawFn) -> list:
    row = [draw(_hostile) for _ in REQUEST_ROW_FIELDS]
    row[0] = draw(st.uuids().map(str))
    row[1] = draw(st.integers(0, 2**41))
    row[2] = draw(st.sampled_from(["allowed", "denied", "unauthenticated", "odd"]))
    for i in range(REQUEST_ROW_FIELDS.index("t0"), REQUEST_ROW_FIELDS.index("t_end") + 1):
        row[i] = draw(st.one_of(st.none(), st.floats(0, 1e6)))
    return row


@settings(max_examples=600, deadline=None)
@given(rows(), st.sampled_from([None, "host/w1"]))
def test_row_is_clean_implies_the_scrubber_changes_nothing(row: list, instance: str | None) -> None:
    event = request_event(row, instance)
    cleaned, dropped = scrub_event(event)
    if row_is_clean(row, _FP):
        assert dropped == [] and cleaned is event
    # a row whose strings are all plain and clean is recognised (the fast path is taken)
    if dropped == [] and all(v is None or type(v) in (str, int, float, bool) for v in row) and cleaned is event:
        assert row_is_clean(row, _FP) or row[2] not in ("allowed", "denied", "unauthenticated", "odd")


def test_row_is_clean_refuses_secrets_and_shapes() -> None:
    base = [None] * len(REQUEST_ROW_FIELDS)
    base[0], base[1], base[2] = "id", 1, "allowed"
    assert row_is_clean(base, _FP)
    for i, bad in ((6, "Bearer abcdefghijklmnop"), (9, "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.x"), (10, "y" * 257),
                   (_FP, "ab" * 32), (_FP, "XYZ"), (12, [1, 2]), (13, {"a": 1})):
        row = list(base)
        row[i] = bad
        assert not row_is_clean(row, _FP), (i, bad)
