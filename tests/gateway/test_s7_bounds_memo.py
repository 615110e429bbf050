"""Issue 14 (session 7): ``Admission.request_bounds`` is kept per Tenant object (frozen; a registry
reload hands out new objects) instead of being rebuilt per request; its value is always
``tenancy.bounds.request_bounds`` of the tenant it is asked for."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.admission import Admission
from gateway.config_state import StateConfig
from gateway.metrics import GatewayMetrics
from tenancy.bounds import request_bounds
from tenancy.registry import Tenant, TenantRegistry
from tenancy.shared import make_limits
from tenancy.tokenizer import WordTokenizer

_OPT = st.one_of(st.none(), st.integers(1, 5000))


def _admission() -> Admission:
    return Admission(TenantRegistry.from_config([]), make_limits(StateConfig()), WordTokenizer(), ["m"],
                     GatewayMetrics(), max_messages=256, max_output_tokens=4096, default_max_prompt_tokens=8192)


_ADM = _admission()


@settings(max_examples=200, deadline=None)
@given(tid=st.sampled_from(["acme", "globex"]), tokens=_OPT, pbytes=_OPT, messages=_OPT, batch=_OPT,
       conc=_OPT)
def test_bounds_are_the_tenants_bounds(tid: str, tokens: int | None, pbytes: int | None, messages: int | None,
                                       batch: int | None, conc: int | None) -> None:
    t = Tenant(id=tid, max_prompt_tokens=tokens, max_prompt_bytes=pbytes, max_messages=messages,
               max_batch_prompts=batch, max_concurrency=conc)
    want = request_bounds(t, WordTokenizer(), max_messages_ceiling=256, default_max_prompt_tokens=8192)
    assert _ADM.request_bounds(t) == want
    assert _ADM.request_bounds(t) == want  # kept: the same answer


def test_the_same_tenant_object_is_not_recomputed_and_a_new_one_is() -> None:
    adm = _admission()
    t = Tenant(id="acme", max_prompt_tokens=100)
    first = adm.request_bounds(t)
    assert adm.request_bounds(t) is first
    reloaded = Tenant(id="acme", max_prompt_tokens=50)  # a registry reload: a new object, same id
    assert adm.request_bounds(reloaded).max_prompt_tokens == 50
    assert adm.request_bounds(t).max_prompt_tokens == 100
