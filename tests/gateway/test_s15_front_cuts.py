"""Session 15 (issue 14), helper "front": the front's cuts keep their answers.

- ``PolicyEnforcementPoint.allowed_candidates`` keeps its last answer by identity of the decision and of
  the candidates: a new list each call, recomputed when either changes;
- ``Admission.prompt_tokens`` returns the first sequence's own id list (no copy) and still the ids of
  every sequence of a batch, in order;
- ``json_fast.loads_checked`` takes its flat-object early return for exactly the same documents.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway import json_fast
from gateway.pep import PolicyEnforcementPoint
from gateway.replicas import Replica
from policy.decision import Decision
from routing.load import InProcessLoadTracker


def _decision(replicas: frozenset[str] | None, pools: frozenset[str] | None = None) -> Decision:
    return Decision(True, "allowed", "", replicas, pools, None, "d1", True)


def _pep() -> PolicyEnforcementPoint:
    return PolicyEnforcementPoint(None, InProcessLoadTracker(), None, None)  # type: ignore[arg-type]


R0, R1, R2 = (Replica(i, "http://x", pool=p) for i, p in (("r0", "a"), ("r1", "a"), ("r2", "b")))


def test_the_same_decision_and_candidates_give_the_same_replicas_in_a_new_list() -> None:
    pep, d = _pep(), _decision(frozenset({"r0", "r2"}))
    first = pep.allowed_candidates([R0, R1, R2], d)
    assert first == [R0, R2]
    first.clear()  # the caller's list: the kept answer is not changed by it
    again = pep.allowed_candidates([R0, R1, R2], d)
    assert again == [R0, R2] and again is not first


def test_another_decision_or_other_candidates_are_filtered_again() -> None:
    pep = _pep()
    d1, d2 = _decision(frozenset({"r0"})), _decision(frozenset({"r1"}))
    assert pep.allowed_candidates([R0, R1], d1) == [R0]
    assert pep.allowed_candidates([R0, R1], d2) == [R1]  # equal fields but another object: recomputed
    assert pep.allowed_candidates([R0], d2) == []  # fewer candidates
    r1b = Replica("r1", "http://y", pool="b")  # same id, another object (a replica set change)
    assert pep.allowed_candidates([R0, r1b], _decision(None, frozenset({"a"}))) == [R0]
    assert pep.allowed_candidates([R0, R1], _decision(None, frozenset({"a"}))) == [R0, R1]


def test_a_deny_everything_decision_allows_nothing_even_after_an_allow() -> None:
    pep = _pep()
    assert pep.allowed_candidates([R0, R1], _decision(None)) == [R0, R1]
    assert pep.allowed_candidates([R0, R1], _decision(frozenset())) == []


class _Tok:
    """Ids = the words' lengths; ``max_text_bytes`` generous."""

    def encode(self, text: str, limit: int | None = None) -> list[int]:
        return [len(w) for w in text.split()]

    def max_text_bytes(self, tokens: int) -> int:
        return 10**9


def _admission() -> Any:
    from gateway.admission import Admission

    adm = Admission.__new__(Admission)  # only prompt_tokens' collaborators
    adm.tokenizer = _Tok()
    return adm


def _req(prompts: tuple[str, ...]) -> Any:
    from gateway.request import InferenceRequest

    return InferenceRequest("completions", "m", False, None, False, {}, prompts[0] if prompts else "", prompts,
                            "", tuple(len(p) for p in prompts))


@pytest.mark.parametrize("prompts, ids", [(("a bb ccc",), [1, 2, 3]), (("a bb", "dddd e"), [1, 2, 4, 1]),
                                        (("a bb", "dddd e", "ccc a", "bb"), [1, 2, 4, 1, 3, 1, 2])])  # R15-1
def test_prompt_tokens_gives_every_sequences_ids_in_order(prompts: tuple[str, ...], ids: list[int]) -> None:
    from tenancy.bounds import RequestBounds

    bounds = RequestBounds(max_prompt_tokens=None, max_prompt_bytes=None, max_messages=8, max_batch_prompts=8)
    assert _admission().prompt_tokens(bounds, _req(prompts)) == (ids, len(ids))


@pytest.mark.parametrize("doc", [
    {"model": "m", "prompt": "x", "max_tokens": 3, "stream": False, "user": None},
    {"model": "m", "prompt": "x", "temperature": 0.5},
    {"model": "m", "prompt": ["x"]},
    {"model": "m", "n": 12345678901234567890},
    {},
])
def test_loads_checked_reads_flat_and_other_bodies_as_before(doc: dict[str, Any]) -> None:
    raw = json.dumps(doc).encode()
    value, fast = json_fast.loads_checked(raw, raw.decode(), max_int_digits=20, max_depth=32)
    assert value == doc and fast is True


@pytest.mark.parametrize("below, lag, shed", [(1024, 0.0, False), (1, 0.0, False), (0, 0.0, True), (-1, 0.0, True),
                                              (1024, 0.8, True), (1, 0.5, False)])
def test_shed_or_enter_sheds_exactly_when_shed_would(below: int, lag: float, shed: bool) -> None:
    from gateway.config import FlowConfig
    from gateway.metrics import GatewayMetrics
    from gateway.overload import OverloadGuard

    guard = OverloadGuard(FlowConfig(shed_loop_lag_s=0.5), GatewayMetrics())
    in_flight = guard.max_in_flight - below  # ``below`` requests short of the shedding bound
    guard.in_flight, guard.lag_s = in_flight, lag
    assert (guard.reason() is not None) is shed
    got = guard.shed_or_enter()
    if shed:
        assert got is not None and got.status_code == 503 and guard.in_flight == in_flight  # not let in
    else:
        assert got is None and guard.in_flight == in_flight + 1


def test_shed_or_enter_counts_a_request_shed_lets_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """R15-3: when ``shed`` (its own test) lets in a request the fast test refused, it is counted as let in,
    so the exit path's ``leave`` does not undercount."""
    from gateway.config import FlowConfig
    from gateway.metrics import GatewayMetrics
    from gateway.overload import OverloadGuard

    guard = OverloadGuard(FlowConfig(shed_loop_lag_s=0.5), GatewayMetrics())
    guard.in_flight, guard.lag_s = guard.max_in_flight, 0.0  # the fast test refuses
    monkeypatch.setattr(guard, "shed", lambda: None)  # the two tests disagree
    assert guard.shed_or_enter() is None and guard.in_flight == guard.max_in_flight + 1
