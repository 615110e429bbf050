"""Session 30 (review30, S30-review30-1): :func:`gateway.pattern_states.pattern_states` built its alphabet (the
positions of each cell of the classes' Boolean combination) outside its work budget, by iterating every bit of every
position's class bit set, each step a big-integer operation as wide as the cells. A quote-free pattern of distinct
non-ASCII literals (each adds cells) and a long counted negated class (``[^"]{n}``: positions whose class holds
every cell) made that positions x cells x cells/64: 1.6 s of event-loop CPU for an admitted 516-character pattern
(7,002 states, under the default cap of 16,384) and 56 s for a refused 508-character one, under the default limits
(docs/security.md "Session 30: review30"). The alphabet is now built per class (each class's bits read once, in C)
and its work is charged to the count's budget like the rest (``WORK_PER_STATE``): the same cells, so the same counts
where the work stays in the budget.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config_http import JsonSchemaLimits
from gateway.pattern_states import pattern_states
from gateway.response_format import response_format_refusal
from tests.hostile.conftest import capture, n_replicas  # noqa: F401 - fixtures
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures
from tests.support.schema_http import PATH, config_overrides, refused  # noqa: F401 - fixture
from tests.support.schema_http import chat as _chat, request_event as _event, rf as _rf


def _wide(literals: int, count: int) -> str:
    """``(?:a|a)`` (a start state with two positions of one class: the alphabet is built), ``literals`` distinct
    non-ASCII literals (two cells each), then ``[^"]{count}`` (quote-free; every cell)."""
    return "(?:a|a)" + "".join(chr(0x100 + 2 * i) for i in range(literals)) + '[^"]{%d}' % count


def test_the_alphabet_work_is_charged_to_the_count() -> None:
    # 7,002 states (the count's own work within its budget before): its alphabet, 500 cells groups x 401 positions,
    # passes 10,000 x WORK_PER_STATE units of work
    assert pattern_states(_wide(500, 400), 10_000) == 10_001  # before: 7,002 after 1.6 s of CPU


@pytest.mark.parametrize(("pattern", "states"), [
    (r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}$", 7), ("[ab]*a[ab]{8}", 513), ("(?:a|ab)*c", 4),
    (r"\w+|\d{3}", 1701), (r"^\d{4}-\d{2}-\d{2}$", 267), (r"(?:[a-z]|\d|_){0,20}x", 2546),
    (r"^(?:\+|00)?[0-9 ]{6,15}$", 32), ('[\u0100\u0102-\u0107]{3}|[^"]{2,5}', 127)])
def test_ordinary_counts_are_unchanged(pattern: str, states: int) -> None:
    assert pattern_states(pattern, 16_384) == states  # the counts of 9f00c353, whose alphabet was built per position


def test_the_hostile_pattern_is_refused_under_the_default_limits() -> None:
    rf = _rf({"type": "object", "properties": {"a": {"type": "string", "pattern": _wide(490, 15_000)}}})
    err = response_format_refusal(rf["response_format"], JsonSchemaLimits(), {}, 100, "review30")
    assert err is not None and err.record["reason"] == "response_format over limits.json_schema.max_pattern_states"


async def test_the_hostile_pattern_is_refused_over_http(stack: Any, capture: Any,
                                                        audit_log: ListLog) -> None:  # noqa: F811
    schema = {"type": "object", "properties": {"QQQ": {"type": "string", "pattern": _wide(490, 15_000)}}}
    r = await stack.client.post(PATH, json=_chat(**_rf(schema)), headers=stack.auth())
    refused(r, capture, "max_pattern_states")  # before too, after ~56 s of the event loop's CPU
    assert _event(audit_log).policy.reason == "response_format over limits.json_schema.max_pattern_states"
