"""R4-12: a completion with ``echo: true`` and ``logprobs`` makes vLLM compute log-probabilities for
every prompt token (``prompt_logprobs = logprobs``), an engine cost the gateway does not charge. It
is refused (400 ``prompt_logprobs_not_allowed``, before policy and upstream) unless the tenant's
``allow_prompt_logprobs: true``; ``echo`` alone and ``logprobs`` alone are served."""

from __future__ import annotations

from typing import Any

import pytest

from tenancy.tenant import TenantConfigError, parse_tenant
from tests.conftest import TD

TENANTS = {"tenancy": {"tenants": [
    {"id": "tenant-a", "spiffe_ids": [f"spiffe://{TD}/tenant-a/"], "models": ["sim-model"], "pools": ["default"],
     "max_output_tokens": 256, "allow_prompt_logprobs": True},
    {"id": "tenant-b", "spiffe_ids": [f"spiffe://{TD}/tenant-b/"], "models": ["sim-model"], "pools": ["default"],
     "max_output_tokens": 256},
]}}


async def _complete(stack: Any, workload: str, **extra: Any) -> Any:
    return await stack.client.post("/v1/completions", headers=stack.auth(workload),
                                   json={"model": "sim-model", "prompt": "hello there", "max_tokens": 2, **extra})


@pytest.mark.parametrize("config_overrides", [TENANTS])
async def test_echo_with_logprobs_is_refused_unless_the_tenant_allows_it(stack: Any) -> None:
    for logprobs in (0, 20):
        r = await _complete(stack, "tenant-b/app", echo=True, logprobs=logprobs)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "prompt_logprobs_not_allowed" and err["param"] == "echo"
    assert (await _complete(stack, "tenant-b/app", echo=True)).status_code == 200
    assert (await _complete(stack, "tenant-b/app", logprobs=5)).status_code == 200
    assert (await _complete(stack, "tenant-b/app", echo=False, logprobs=5)).status_code == 200
    assert (await _complete(stack, "tenant-a/app", echo=True, logprobs=5)).status_code == 200


def test_the_tenant_key_is_a_strict_boolean_defaulting_to_off() -> None:
    base = {"id": "t", "spiffe_ids": [f"spiffe://{TD}/t/"]}
    assert parse_tenant(base, 0).allow_prompt_logprobs is False
    assert parse_tenant({**base, "allow_prompt_logprobs": True}, 0).allow_prompt_logprobs is True
    with pytest.raises(TenantConfigError, match="allow_prompt_logprobs"):
        parse_tenant({**base, "allow_prompt_logprobs": "yes"}, 0)
