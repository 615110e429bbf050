"""Session 4 (s4-small item 4): ``limits.max_prompt_tokens`` bounds the prompts of tenants that set none."""
from __future__ import annotations

from typing import Any

from gateway.config_http import LimitsConfig
from tenancy.bounds import request_bounds
from tenancy.registry import TenantRegistry
from tenancy.tokenizer import WordTokenizer

JSON = {"content-type": "application/json"}


def _tenant(**kw: Any):
    doc = {"id": "t", "spiffe_ids": ["spiffe://td/t/"], **kw}
    return TenantRegistry.from_config([doc]).get("t")


def test_default_ceiling_is_documented_value() -> None:
    assert LimitsConfig().max_prompt_tokens == 8192
    assert LimitsConfig(max_prompt_tokens=None).max_prompt_tokens is None


def test_ceiling_applies_only_to_tenants_that_set_none() -> None:
    tok = WordTokenizer()
    b = request_bounds(_tenant(), tok, max_messages_ceiling=2048, default_max_prompt_tokens=16384)
    assert b.max_prompt_tokens == 16384 and b.max_prompt_bytes == tok.max_text_bytes(16385) + 4096
    own = request_bounds(_tenant(max_prompt_tokens=100000), tok, max_messages_ceiling=2048,
                         default_max_prompt_tokens=16384)
    assert own.max_prompt_tokens == 100000
    none = request_bounds(_tenant(), tok, max_messages_ceiling=2048)
    assert none.max_prompt_tokens is None and none.max_prompt_bytes is None


async def test_tenant_without_limit_is_refused_over_the_gateway_ceiling(stack) -> None:
    auth = stack.auth("tenant-b/app")  # tenant-b sets no max_prompt_tokens (tests/conftest.py)
    over = {"model": "sim-model", "prompt": "x " * 8193, "max_tokens": 1}
    r = await stack.client.post("/v1/completions", json=over, headers={**auth, **JSON})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "context_length_exceeded" and "8192" in r.json()["error"]["message"]
    ok = {"model": "sim-model", "prompt": "x " * 8000, "max_tokens": 1}
    r = await stack.client.post("/v1/completions", json=ok, headers={**auth, **JSON})
    assert r.status_code == 200, r.text
