"""Issue 14 (session 7): the PEP keys a request without building its identity and request dicts
(``policy.cache.head_key_fields``); for any facts, well- or mistyped, that part equals
``head_key_part`` of the dicts ``build_policy_input`` gets, so a hit is never decided on facts the
built document would refuse."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import GatewayError
from policy.cache import head_key_fields, head_key_part
from policy.input import PolicyInputError
from tests.policy.test_s6_pep_key import _identity, _pep

ANY = st.one_of(st.none(), st.booleans(), st.integers(-2, 3), st.floats(allow_nan=True), st.text(max_size=2),
                st.just({}), st.just(MappingProxyType({"a": 1})), st.just([1]))
STR = st.one_of(st.sampled_from(["", "x", "spiffe://t/a"]), ANY)


@settings(max_examples=500, deadline=None)
@given(sid=STR, td=STR, claims=ANY, endpoint=STR, model=STR, pt=ANY, mt=ANY, stream=ANY, seq=ANY, q=ANY)
def test_fields_equal_the_dicts_part(sid: Any, td: Any, claims: Any, endpoint: Any, model: Any, pt: Any, mt: Any,
                                     stream: Any, seq: Any, q: Any) -> None:
    ident = {"spiffe_id": sid, "trust_domain": td, "claims": claims}
    rq = {"endpoint": endpoint, "model": model, "prompt_tokens": pt, "max_tokens": mt, "stream": stream,
          "sequences": seq, "queued_requests": q}
    assert head_key_fields(sid, td, claims or {}, endpoint, model, pt, mt, stream, seq, q) == head_key_part(ident, rq)


async def test_a_mistyped_request_fact_is_refused_by_the_built_document() -> None:
    from gateway.replicas import Replica
    from gateway.request import InferenceRequest
    from tenancy.registry import Tenant

    pep, _, inner, _ = _pep([])
    t = Tenant(id="acme", models=frozenset({"m"}), pools=frozenset({"p"}))
    cands = [Replica("r0", "http://x", pool="p")]
    ok = InferenceRequest("completions", "m", False, 5, False, {}, "")
    await pep.decide(_identity("spiffe://t/ns/a"), t, ok, 3, cands, "/v1/completions")
    bad = InferenceRequest("completions", "m", "yes", 5, False, {}, "")  # type: ignore[arg-type]
    with pytest.raises(GatewayError) as err:  # never answered from the cached decision of `ok`: fail closed
        await pep.decide(_identity("spiffe://t/ns/a"), t, bad, 3, cands, "/v1/completions")
    assert err.value.status == 503 and isinstance(err.value.__context__, PolicyInputError)
    assert len(inner.docs) == 1
