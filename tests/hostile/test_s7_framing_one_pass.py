"""Session 7, issue 14: the framing guard reads a request's framing fields in one pass over its head
(:class:`gateway.framing.FramedRequest`) with the same verdict as :func:`gateway.framing.framing_problem`
and the same declared length as before, for any mix of Content-Length / Transfer-Encoding / Expect fields."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.framing import FramedRequest, FramingGuard, framing_problem


def _Body(headers: list[tuple[bytes, bytes]], wire: None) -> FramedRequest:
    """The framing guard's view of a request with ``headers``."""
    return FramedRequest(FramingGuard(None, max_drain_bytes=0, drain_timeout_s=1), {"headers": headers}, None)  # type: ignore[arg-type]

_values = st.one_of(st.sampled_from([b"0", b"12", b"012", b" 12 ", b"12, 12", b"12,13", b"", b"-1", b"1_2",
                                     b"\xd9\xa1", b"chunked", b"Chunked", b"gzip, chunked", b"chunked, chunked",
                                     b"100-continue", b" 100-Continue"]),
                    st.binary(max_size=6))
_fields = st.lists(st.tuples(st.sampled_from([b"content-length", b"transfer-encoding", b"expect", b"host"]), _values),
                   max_size=4)


def _declared_before(headers: list[tuple[bytes, bytes]]) -> int | None:
    declared = None
    for name, value in headers:
        if name == b"content-length":
            declared = int(value.split(b",")[0].strip())
    return declared


@settings(max_examples=800, deadline=None)
@given(_fields)
def test_one_pass_matches_framing_problem(headers: list[tuple[bytes, bytes]]) -> None:
    body = _Body(headers, None)
    assert body.problem == framing_problem(headers)
    if body.problem is None:
        assert body.declared == _declared_before(headers)
        chunked = any(n == b"transfer-encoding" for n, _ in headers)
        assert body.complete == (not chunked and not body.declared)
        assert body.expect_continue == any(n == b"expect" and v.strip().lower() == b"100-continue" for n, v in headers)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 50), st.integers(1, 50), st.integers(0, 60), st.integers(0, 60), st.integers(0, 60))
def test_fits_is_takes_verdict(total: int, share: int, held_mine: int, held_other: int, n: int) -> None:
    from gateway.body_budget import BodyBudget

    if share > total:
        share, total = total, share
    budget = BodyBudget(total, share)
    budget.take("other", held_other)
    budget.take("mine", held_mine)
    before = (budget.held, budget.held_by("mine"))
    verdict = budget.fits("mine", n)
    assert (budget.held, budget.held_by("mine")) == before
    assert verdict == budget.take("mine", n)


@settings(max_examples=300, deadline=None)
@given(_fields)
def test_plain_length_is_one_digits_field(headers: list[tuple[bytes, bytes]]) -> None:
    body = _Body(headers, None)
    lengths = [v for n, v in headers if n == b"content-length"]
    encodings = [v for n, v in headers if n == b"transfer-encoding"]
    assert body.plain == (not encodings and len(lengths) == 1 and lengths[0].isdigit())
    if body.plain:
        assert body.problem is None and body.declared == int(lengths[0])
