"""Review R10b-1 and R10b-3 (session 10, second attacker pass) of the decision cache's key scan
(policy/input_refs.py, R10-2's fix).

R10b-1: a reference whose first term is a call, array, object or comprehension was not scanned
inside that term, so ``object.union(input.request, {}).prompt_tokens > 50`` left the cache on its
default key and the custom rule was bypassed again. R10b-3: OPA's non-deterministic built-ins
(``time.now_ns``, ``rand.intn``, ``uuid.rfc4122``, ``http.send``...) were cached for the cache's
lifetime. Both fail before the fix.
"""
from __future__ import annotations

import pytest

from policy.input_refs import WHOLE_INPUT, module_input_paths, policy_key_fields

HEAD = "package p\nimport rego.v1\n"


@pytest.mark.parametrize(("body", "expected"), [
    ("x if object.union(input.request, {}).prompt_tokens > 50", {"request"}),
    ("x if [input.request][0].prompt_tokens > 50", {"request"}),
    ("x if {\"r\": input.request}.r.prompt_tokens > 50", {"request"}),
    ("x if object.get(input, \"request\", {}).prompt_tokens > 50", {WHOLE_INPUT}),
    ("x if [r | r := input.request][0].max_tokens > 3", {"request"}),
    ("x if json.unmarshal(json.marshal(input.identity)).claims.team == \"a\"", {"identity"}),
])
def test_a_reference_rooted_in_a_call_or_collection_is_scanned(body: str, expected: set[str]) -> None:
    assert set(module_input_paths(f"b{hash(body)}.rego", HEAD + body + "\n")) == expected
    key = policy_key_fields({"m.rego": HEAD + body + "\n"})
    assert key is None or "request" in key or "identity" in key  # never the default key alone


@pytest.mark.parametrize("body", [
    "x if time.now_ns() > 0",
    "x if rand.intn(\"k\", 10) == 1",
    "x if uuid.rfc4122(\"k\") != \"\"",
    "x if http.send({\"method\": \"GET\", \"url\": \"http://127.0.0.1:1/\"}).status_code == 200",
    "x if net.lookup_ip_addr(\"localhost\")",
    "x if opa.runtime().env.X == \"1\"",
])
def test_non_deterministic_built_ins_are_never_cached(body: str) -> None:
    assert policy_key_fields({"m.rego": HEAD + body + "\n"}) is None
