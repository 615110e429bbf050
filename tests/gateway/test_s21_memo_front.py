"""Session 21 (issue 14): the admission front calls the tenant's prompt memo (tenancy/prompt_memo.py) and
:class:`gateway.prefix_keys.PrefixKeys` resumes its chains: the counts, the refusals and the chains are those
of the front without a memo, a resent conversation is served from the memo, and ``bytes_per_tenant: 0``
(or the default built gateway's setting) decides whether the gateway has one."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.admission_front import parse_and_count
from gateway.config_routing import RoutingConfig
from gateway.config_tenancy import TenancyConfig
from gateway.errors import GatewayError
from gateway.prefix_keys import PrefixKeys
from tenancy.keys import KeyRing
from tests.gateway.test_s19_trim4_front import LIMITS, TENANTS, _admission

MASTER = b"s21-memo-front-master-secret-32b!"


def _stack(memo_bytes: int) -> tuple[Any, PrefixKeys]:
    adm = _admission()
    adm.default_max_prompt_tokens = 100_000  # the plain tenant's conversation fits; "small" stays at 8
    tenancy = TenancyConfig(prompt_memo={"bytes_per_tenant": memo_bytes})
    keys = PrefixKeys.from_config(KeyRing(MASTER), adm.tokenizer, RoutingConfig(), tenancy)
    adm.prompt_memo = keys.memo
    return adm, keys


def _front(adm: Any, keys: PrefixKeys, body: dict[str, Any], tenant: str) -> Any:
    t = TENANTS[tenant]
    try:
        _, _, tokens, n, _ = parse_and_count(adm, json.dumps(body).encode(), "chat", LIMITS, adm.request_bounds(t),
                                             t, None, False)
    except GatewayError as err:
        return err.status, err.code
    return list(tokens), n, keys.prefix_chains(t, tokens).current


def test_front_with_memo_equals_front_without() -> None:
    with_memo, without = _stack(1 << 20), _stack(0)
    assert with_memo[1].memo is not None and without[1].memo is None and without[0].prompt_memo is None
    msgs = [{"role": "system", "content": "You answer questions about the weather. " * 60}]
    for turn in range(4):
        msgs.append({"role": "user", "content": f"question {turn}: will it rain on day {turn}? " * 9})
        for tenant in ("plain", "small"):  # small: max_prompt_tokens 8 (a refusal, the memo's limit path)
            body = {"model": "m", "messages": msgs}
            assert _front(*with_memo, body, tenant) == _front(*without, body, tenant)
        msgs.append({"role": "assistant", "content": "It will rain a little, then clear up. " * 5})
    memo = with_memo[1].memo
    assert memo is not None and memo.hit_tokens > memo.tokens // 2  # the resent conversation came from it


@pytest.mark.parametrize("size", [0, 4096])
def test_built_gateway_has_a_memo_unless_off(size: int) -> None:
    adm, keys = _stack(size)
    assert (adm.prompt_memo is None) == (size == 0) and keys.memo is adm.prompt_memo
