"""Session 30 (pattern30, S30-pattern30-1; the hole: S29-pattern29-2): :func:`gateway.pattern_states.pattern_states`
counts the states of a ``pattern``'s determinised automaton under a cap, and ``limits.json_schema.max_pattern_states``
bounds their sum over a schema in :func:`gateway.response_format.response_format_refusal` / ``tools_refusal``.

The count is checked against a reference that shares no code with it: the number of prefixes told apart by their
residual languages (each prefix's set of accepted suffixes, read with Python's ``re`` on strings over the pattern's
alphabet) is a lower bound of any DFA's states, so a count under it would be unsound. Exact values on the families
whose automata are known (``[ab]*a[ab]{k}``: ``2**(k+1) + 1``), the UTF-8 weights against outlines-core's own
count (measured: bench/s30_pattern30_states.py), the cap and the fail-closed constructs, the walk's sum, the tenant
override and the per-tenant cache.
"""

from __future__ import annotations

import itertools
import re
import signal
import time
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gateway.config_http import JsonSchemaLimits
from gateway.pattern_states import UNICODE_CLASS_STATES, pattern_states
from gateway.response_format import response_format_refusal, tools_refusal
from gateway.schema_patterns import CACHED_PATTERN_CHARS, cost_cache_info, states_cache_clear
from tenancy.tenant import TenantConfigError, parse_tenant

LIMITS = JsonSchemaLimits()
BIG = 1 << 20

# ------------------------------------------------------------------ the count against the reference

_ATOMS = st.sampled_from(["a", "b", "c", "[ab]", "[bc]", "[abc]", "[^a]", "(?:a|b)", "(?:ab|a)", "(?:a|bc)"])


def _quantified(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.tuples(inner, st.sampled_from(["", "", "*", "+", "?", "{2}", "{1,3}", "{0,2}", "{2,}"])).map(
        lambda t: t[0] if not t[1] else f"(?:{t[0]}){t[1]}" if len(t[0]) > 1 and not t[0].startswith(
            ("[", "(?:")) else t[0] + t[1])


_PATTERNS = st.recursive(
    _quantified(_ATOMS),
    lambda inner: st.one_of(
        st.lists(inner, min_size=2, max_size=4).map("".join),
        st.lists(inner, min_size=2, max_size=3).map(lambda xs: "(?:" + "|".join(xs) + ")"),
        _quantified(inner.map(lambda x: f"(?:{x})"))),
    max_leaves=6)


def _told_apart(pattern: str, alphabet: str = "abcd", prefix_len: int = 4, suffix_len: int = 3) -> int:
    """Prefixes (over ``alphabet``, up to ``prefix_len``) with distinct non-empty residuals (suffixes up to
    ``suffix_len`` after which the whole matches, read by Python's ``re``): a lower bound of the live states of any
    DFA of the pattern."""
    rx = re.compile(pattern)
    suffixes = ["".join(s) for n in range(suffix_len + 1) for s in itertools.product(alphabet, repeat=n)]
    seen = set()
    for n in range(prefix_len + 1):
        for prefix in itertools.product(alphabet, repeat=n):
            w = "".join(prefix)
            residual = frozenset(s for s in suffixes if rx.fullmatch(w + s))
            if residual:
                seen.add(residual)
    return len(seen)


class _OracleTimeout(Exception):
    pass


def _raise_timeout(*_: object) -> None:
    raise _OracleTimeout


def _bounded(fn: Any, seconds: float) -> Any:
    """``fn()``, or None when it runs past ``seconds``: Python's backtracking ``re`` (the oracle, not the code under
    test) can take minutes on nested quantifiers (a hang seen in session 30, review30). SIGALRM interrupts ``re``'s
    matching loop; pytest-timeout's own alarm (the signal method) is restored with its remaining time."""
    previous = signal.signal(signal.SIGALRM, _raise_timeout)
    left, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    started = time.monotonic()
    try:
        return fn()
    except _OracleTimeout:
        return None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if left:
            signal.setitimer(signal.ITIMER_REAL, max(left - (time.monotonic() - started), 0.001))


@settings(max_examples=150, deadline=None)
@given(_PATTERNS)
def test_the_count_is_never_below_the_states_python_re_tells_apart(pattern: str) -> None:
    """Sound: every pair of prefixes ``re`` tells apart needs two states of any DFA, outlines-core's included. A
    pattern whose oracle ``re`` backtracks past 5 s is not judged (rare: nested quantifiers)."""
    count = pattern_states(pattern, BIG)
    assert count <= BIG, pattern
    told = _bounded(lambda: _told_apart(pattern), 5.0)
    assume(told is not None)
    assert count >= told, pattern


@pytest.mark.parametrize("k", [1, 3, 6])
def test_the_classic_blow_up_is_counted_exactly(k: int) -> None:
    """``[ab]*a`` then ``k`` atoms: the DFA must remember the last ``k + 1`` characters (plus the start)."""
    assert pattern_states("[ab]*a" + "[ab]" * k, BIG) == 2 ** (k + 1) + 1
    assert pattern_states(f"(a|b)*a(a|b){{{k}}}", BIG) == 2 ** (k + 1) + 1
    assert pattern_states(f"^[ab]*a(?:[ab]){{{k}}}$", BIG) == 2 ** (k + 1) + 1  # ^...$ dropped as outlines-core does


@pytest.mark.parametrize("k", [10, 14])
def test_larger_subsets_are_charged_their_work(k: int) -> None:
    """States of ~k/2 positions each: the count's own work (WORK_PER_STATE per state) is charged past the states."""
    got = pattern_states("[ab]*a" + "[ab]" * k, BIG)
    assert 2 ** (k + 1) + 1 <= got <= 2 * (2 ** (k + 1) + 1)


def test_linear_patterns_count_their_positions() -> None:
    assert pattern_states("a" * 50, BIG) == 51
    assert pattern_states("[a-z]{1,64}", BIG) == 65
    assert pattern_states("(?:ab){3,5}", BIG) == 11
    assert pattern_states("[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+", BIG) < 10


def test_nested_counts_and_groups_multiply() -> None:
    assert pattern_states("[ab]*a(?:[ab]{2}){4}", BIG) == 2 ** 9 + 1
    assert pattern_states("(((([ab]*a[ab]{5}))))", BIG) == 2 ** 6 + 1
    assert pattern_states("(?:x|[ab]*a[ab]{5})", BIG) == 2 ** 6 + 2


def test_unicode_classes_weigh_their_utf8_states() -> None:
    """Rust's ``\\w`` is Unicode: outlines-core's byte-level DFA has ~317 states for ``\\w`` alone (its Index over the
    256 single bytes); an ASCII class has none beyond its positions."""
    assert pattern_states("\\w", BIG) >= UNICODE_CLASS_STATES["w"]
    assert pattern_states("[\\w-]{1,63}", BIG) >= 63 * UNICODE_CLASS_STATES["w"]
    assert pattern_states("[A-Za-z0-9_-]{1,63}", BIG) == 64
    assert pattern_states("[^a]", BIG) > 2  # a negated class reads every non-ASCII character
    assert pattern_states("é", BIG) == 3


@pytest.mark.parametrize("pattern", ["\\p{L}+", "(?x)a b", "[[:alpha:]]", "[a&&b]", "(?=a)", "a**?{", "(a", "a)",
                                     "\\1", "\\0", "?", "a{2,1}", "(?i)[é]", "a{99999999999}", "\\"])
def test_what_is_not_modelled_counts_as_over(pattern: str) -> None:
    assert pattern_states(pattern, 1000) == 1001


def test_the_cap_stops_the_count() -> None:
    assert pattern_states("[ab]*a" + "[ab]" * 30, 4096) == 4097
    assert pattern_states("(?:(?:(?:a{1000}){1000}){1000})", 4096) == 4097  # positions computed before any build
    assert pattern_states("a{4096}", 4097) == 4097  # at the cap: admitted
    assert pattern_states("(?:a?){1000}", 4096) == 4097  # quadratic follow sets: the work's budget
    assert pattern_states("((a?){100}){100}", 4096) == 4097


def test_case_folding_is_modelled_for_ascii() -> None:
    """``(?i)k`` also reads U+212A (KELVIN SIGN) in Rust: a class of three characters, one position."""
    assert pattern_states("(?i)k", BIG) == 2 + 2  # the start, the position, its non-ASCII member's UTF-8 state(s)
    assert pattern_states("(?i)[ab]*a[ab]{4}", BIG) == 2 ** 5 + 1

# ------------------------------------------------------------------ the bound in the walk


def _rf(*patterns: str) -> dict[str, Any]:
    props = {f"p{i}": {"type": "string", "pattern": p} for i, p in enumerate(patterns)}
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": props,
                                                                           "required": list(props)}}}


def test_a_blow_up_pattern_is_refused_naming_the_bound() -> None:
    states_cache_clear()
    err = response_format_refusal(_rf("^[ab]*a" + "[ab]" * 20 + "$"), LIMITS, {}, 100, "t")
    assert err is not None and (err.status, err.code) == (400, "json_schema_too_complex")
    assert err.param == "response_format.json_schema.schema.properties.p0.pattern"
    assert "limits.json_schema.max_pattern_states" in err.message
    assert err.record == {"reason": "response_format over limits.json_schema.max_pattern_states"}
    assert response_format_refusal(_rf("^[ab]*a" + "[ab]" * 11 + "$"), LIMITS, {}, 100, "t") is None  # 4,228
    # session 31 (pattern31, S31-pattern31-1): the default is 8,192; 8,964 states (admitted at 16,384) are refused
    assert response_format_refusal(_rf("^[ab]*a" + "[ab]" * 12 + "$"), LIMITS, {}, 100, "t") is not None


def test_the_states_of_a_schemas_patterns_add_up() -> None:
    part = "[ab]*a" + "[ab]" * 9  # 1,025 states
    assert pattern_states(part, BIG) == 1025
    assert response_format_refusal(_rf(*[part] * 7), LIMITS, {}, 100, "t") is None  # 7,175
    err = response_format_refusal(_rf(*[part] * 8), LIMITS, {}, 100, "t")  # 8,200 > 8,192
    assert err is not None and err.param.endswith(".pattern")  # the walk's order: the fourth it counts


def test_a_tool_is_bounded_too() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": _rf("[ab]*a" + "[ab]" * 20)[
        "json_schema"]["schema"]}}]
    err = tools_refusal(tools, LIMITS, {}, 100, "required", "t")
    assert err is not None and err.record == {"reason": "tools parameters over limits.json_schema.max_pattern_states"}


def test_quote_reading_patterns_are_left_to_their_own_bound() -> None:
    err = response_format_refusal(_rf(".*a" + "." * 20), LIMITS, {}, 100, "t")
    assert err is not None and err.record["reason"].endswith("quote_reading_patterns")


def test_the_tenant_value_and_null_stand() -> None:
    hostile = _rf("[ab]*a" + "[ab]" * 20)
    assert response_format_refusal(hostile, LIMITS, {"max_pattern_states": None}, 100, "t") is None
    assert response_format_refusal(hostile, JsonSchemaLimits(max_pattern_states=None), {}, 100, "t") is None
    assert response_format_refusal(_rf("[ab]*a" + "[ab]" * 12), LIMITS, {"max_pattern_states": 1000}, 100,
                                   "t") is not None
    doc = {"id": "t", "spiffe_ids": ["spiffe://x/t/"]}
    assert dict(parse_tenant({**doc, "json_schema_limits": {"max_pattern_states": None}}, 0)
                .json_schema_limits) == {"max_pattern_states": None}
    assert dict(parse_tenant({**doc, "json_schema_limits": {"max_pattern_states": 500}}, 0)
                .json_schema_limits) == {"max_pattern_states": 500}
    with pytest.raises(TenantConfigError) as got:
        parse_tenant({**doc, "json_schema_limits": {"max_pattern_states": 0}}, 0)
    assert "max_pattern_states to a positive integer or null" in str(got.value)


def test_counts_are_cached_per_tenant() -> None:
    states_cache_clear()
    rf = _rf("^\\d{4}-\\d{2}-\\d{2}$")
    for tenant in ("a", "a", "b"):
        assert response_format_refusal(rf, LIMITS, {}, 100, tenant) is None
    info = cost_cache_info()
    assert (info.hits, info.misses, info.currsize) == (1, 2, 2)  # tenant b did not hit tenant a's entry
    long = _rf("a" * (CACHED_PATTERN_CHARS + 1))  # counted each time, never kept: the cache's memory stays bounded
    assert response_format_refusal(long, LIMITS, {"max_pattern_chars": 4096}, 100, "a") is None
    assert cost_cache_info().currsize == 2


def _any_of(*patterns: str) -> dict[str, Any]:
    members = [{"type": "string", "pattern": p} for p in patterns]
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"anyOf": members}}, "required": ["a"]}}}


def test_an_any_of_of_patterns_is_counted_as_their_alternation() -> None:
    """outlines-core writes ``("p1"|"p2"|...)``: cycles of 7, 11, ..., 23 need their product (7.4 M states) together
    while each alone needs at most 24 (S30-pattern30-2)."""
    cycles = [f"^(?:a{{{p}}})*$" for p in (7, 11, 13, 17, 19, 23)]
    assert sum(pattern_states(p, BIG) for p in cycles) < 100
    err = response_format_refusal(_any_of(*cycles), LIMITS, {}, 100, "t")
    assert err is not None and err.param == "response_format.json_schema.schema.properties.a.anyOf"
    assert err.record == {"reason": "response_format over limits.json_schema.max_pattern_states"}
    assert response_format_refusal(_any_of(*cycles[:3]), LIMITS, {}, 100, "t") is None  # 1,002 states
    assert response_format_refusal(_any_of("^\\d{4}-\\d{2}$", "^[a-z]{2,8}$"), LIMITS, {}, 100, "t") is None
    one_of = _any_of(*cycles)
    schema = one_of["json_schema"]["schema"]["properties"]["a"]
    schema["oneOf"] = schema.pop("anyOf")
    assert response_format_refusal(one_of, LIMITS, {}, 100, "t") is not None


def test_array_items_count_once_per_copy_outlines_core_writes() -> None:
    """``[item(,item){m-1,n-1}]``: each copy of the item's pattern has its own states (an array of a 8,193-state
    pattern: 16,392 DFA states in outlines-core 0.2.14; bench/s30_pattern30_states.py)."""
    def array(pattern: str, **counts: int) -> dict[str, Any]:
        return {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "array", "items": {"type": "string", "pattern": pattern}, **counts}}}
    part = "[ab]*a" + "[ab]" * 9  # 1,025 states
    assert response_format_refusal(array(part), LIMITS, {}, 100, "t") is None  # 2 copies
    assert response_format_refusal(array(part, minItems=6), LIMITS, {}, 100, "t") is None  # 7 copies: 7,175
    err = response_format_refusal(array(part, maxItems=7), LIMITS, {}, 100, "t")  # 8 copies: 8,200 > 8,192
    assert err is not None and err.param == "response_format.json_schema.schema.items.pattern"
    nested = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "maxItems": 3, "items": {
        "type": "array", "maxItems": 3, "items": {"type": "string", "pattern": part}}}}}
    assert response_format_refusal(nested, LIMITS, {}, 100, "t") is not None  # 4 x 4 copies


def test_tool_choice_required_counts_each_tool_twice() -> None:
    """vLLM's ``required`` schema is an array of the tools: outlines-core writes each tool's parameters twice."""
    part = "[ab]*a" + "[ab]" * 9  # 1,025 states
    params = _rf(*[part] * 5)["json_schema"]["schema"]  # 5,125 once, 10,250 twice (cap 8,192)
    tools = [{"type": "function", "function": {"name": "f", "parameters": params}}]
    assert tools_refusal(tools, LIMITS, {}, 100, "auto", "t") is None
    err = tools_refusal(tools, LIMITS, {}, 100, "required", "t")
    assert err is not None and err.record == {"reason": "tools parameters over limits.json_schema.max_pattern_states"}


def test_references_count_once_per_place_outlines_core_inlines_them() -> None:
    """8 properties referring to one definition of ``[ab]*a`` + 12 ``[ab]``: outlines-core 0.2.14 builds 65,626 DFA
    states (8 x 8,204); the walk meets the definition once (S30-pattern30-6)."""
    part = "[ab]*a" + "[ab]" * 11  # 4,228 counted (under the default cap of 8,192 once, not 8 times)

    def refs(n: int, pattern: str) -> dict[str, Any]:
        props = {f"a{i}": {"$ref": "#/$defs/p"} for i in range(n)}
        return {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "$defs": {"p": {"type": "string", "pattern": pattern}}, "properties": props}}}
    err = response_format_refusal(refs(8, part), LIMITS, {}, 100, "t")
    assert err is not None and err.param == "response_format.json_schema.schema"
    assert err.record == {"reason": "response_format over limits.json_schema.max_pattern_states"}
    assert "$ref" in err.message
    assert response_format_refusal(refs(29, "^\\d{4}-\\d{2}-\\d{2}$"), LIMITS, {}, 100, "t") is None  # 30 x 267
    assert response_format_refusal(refs(8, part), LIMITS, {"max_pattern_states": None}, 100, "t") is None
    tools = [{"type": "function", "function": {"name": "f", "parameters": refs(8, part)["json_schema"]["schema"]}}]
    assert tools_refusal(tools, LIMITS, {}, 100, "auto", "t") is not None
