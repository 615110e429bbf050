"""Session 20, helper fixreg (fixq-2, residual of S19-R6): the re-decision checks each prompt of a batch
against ``max_prompt_tokens``, as arrival does.

A queued request keeps its counts, not its prompt text (R12-2). Until session 20 a batch kept only its total,
and ``check_kept_bounds`` (gateway/pep_recheck.py) refused it only above ``max_prompt_tokens`` x sequences: one
long prompt beside short ones passed. ``Admission.prompt_tokens`` now keeps the longest sequence's count in
``req.longest_prompt_tokens`` and the re-check compares it with the bound.
"""
from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.errors import GatewayError
from gateway.pep_recheck import check_kept_bounds
from gateway.request import parse_inference_request
from tenancy.bounds import RequestBounds
from tests.gateway.test_s18_recheck_registry import queued_through, reload, tenant_a
from tests.gateway.test_s19_fixq_bounds import completion
from tests.gateway.test_s19_trim4_front import TENANTS, _admission
from tests.support import flow
from tests.support.flow import HOLD_UNTIL_CANCELLED

replica_cfg, n_replicas = flow.replica_cfg, flow.n_replicas  # one slow replica

LONG = [" ".join(f"w{i}" for i in range(40)), "a"]  # 40 + 1 tokens: one prompt over 30, the total under 60


def _code(bounds: RequestBounds, req: Any, tokens: int) -> str | None:
    try:
        check_kept_bounds(bounds, req, tokens, None, parsed=False)
    except GatewayError as err:
        return err.code
    return None


@pytest.mark.parametrize(("sizes", "expected"), [((2, 3), 3), ((7, 1, 4), 7), ((5,), 5)])
def test_the_count_keeps_the_longest_sequence(sizes: tuple[int, ...], expected: int) -> None:
    adm = _admission()
    prompts = [" ".join(["x"] * n) for n in sizes]
    body = json.dumps({"model": "m", "prompt": prompts if len(prompts) > 1 else prompts[0]}).encode()
    req = parse_inference_request(body, "completions", 64, max_messages=64, max_batch_prompts=8)
    _, total = adm.prompt_tokens(adm.request_bounds(TENANTS["plain"]), req)
    assert (total, req.longest_prompt_tokens) == (sum(sizes), expected)


def test_each_prompt_of_a_kept_batch_is_checked_against_the_bound() -> None:
    req = completion(5, 5)
    req.longest_prompt_tokens = 7  # 7 + 1 tokens
    assert _code(RequestBounds(6, 1000, 8, 4), req, 8) == "context_length_exceeded"  # before: 8 <= 6 x 2 passed
    assert _code(RequestBounds(7, 1000, 8, 4), req, 8) is None  # at the bound: as a fresh request


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    return {**HOLD_UNTIL_CANCELLED, "flow": {"replica_max_running_requests": 1}}


async def test_a_queued_batch_with_one_prompt_over_a_lowered_bound_is_refused(stack: Any) -> None:
    async def lower(st: Any) -> None:
        await reload(st, tenant_a(max_prompt_tokens=30))

    _, r = await queued_through(stack, lower, fresh=False, prompt=LONG)
    fresh = await stack.client.post("/v1/completions", json={"model": "sim-model", "prompt": LONG,
                                                             "max_tokens": 20}, headers=stack.auth())
    assert fresh.status_code == 400 and fresh.json()["error"]["code"] == "context_length_exceeded"
    assert r.status_code == 400, f"the queued batch was sent with a prompt over the bound: {r.status_code}"
    assert r.json()["error"]["code"] == "context_length_exceeded"
