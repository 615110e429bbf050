"""Routing authorization against the running gateway, the SAME tests in
embedded and remote mode (``pdp_mode``), with the shipped ``rego/`` policy
and demo data (issue 4, "Done when").

Setup (tests/conftest.py): replicas r0, r1 in pool ``default``, r2 in pool
``eu`` labelled ``data_residency=eu``; tenant-a and tenant-b entitled to
``default`` (tenant-b also lists the reserved ``eu`` pool, which the policy
never grants a non-regulated tenant); tenant-reg regulated, residency ``eu``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from policy.decision import PolicyUnavailableError
from policy.embedded import EmbeddedOpa
from sim.replay import ReplayConfig, replay
from sim.trace import assign_tenants, load_mooncake, sim_prompt_tokens

PROMPT = "policy e2e " + " ".join(f"w{i}" for i in range(40))


def body(max_tokens: int = 4, model: str = "sim-model", prompt: str = PROMPT) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens}


def replica_requests(stack: Any) -> list[int]:
    """Requests each simulated replica received (index i = replica ``r{i}``)."""
    return [s.counters.requests for s in stack.cluster.states]


def request_events(log: Any) -> list[Any]:
    return [e for e in log.events if e.request_id]


async def test_entitled_request_is_routed(stack: Any, audit_log: Any, pdp_mode: str) -> None:
    r = await stack.client.post("/v1/completions", headers=stack.auth("tenant-a/app"), json=body())
    assert r.status_code == 200, r.text
    counts = replica_requests(stack)
    assert sum(counts) == 1 and counts[2] == 0  # a default-pool replica served it
    (ev,) = request_events(audit_log)
    assert ev.outcome.value == "allowed" and ev.route.replica in ("r0", "r1")
    assert ev.policy.decision_id and ev.policy.reason_code == "allowed"


async def test_unentitled_model_is_answered_as_unknown_and_audited_as_denied(
    stack: Any, audit_log: Any, pdp_mode: str
) -> None:
    r = await stack.client.post("/v1/completions", headers=stack.auth("tenant-a/app"),
                                json=body(model="other-model"))
    # R3-7: the unknown model's 404, so the answer confirms no other tenant's model name;
    # refused at the model check (tenancy.tenants[].models), before the policy is asked
    assert r.status_code == 404, r.text
    err = r.json()["error"]
    assert err["code"] == "model_not_found" and "decision_id" not in err
    assert "entitled" not in r.text
    assert replica_requests(stack) == [0, 0, 0]
    (ev,) = request_events(audit_log)
    # the true reason goes only to the audit trail
    assert ev.outcome.value == "denied" and ev.route.replica is None
    assert ev.policy.reason_code == "model_not_entitled"


async def test_regulated_tenant_only_reaches_its_labelled_pool_over_a_replay(
    stack: Any, audit_log: Any, pdp_mode: str
) -> None:
    """A trace replay of up to 60 requests from three tenants (conversations keep
    their tenant): every tenant-reg request lands on r2 (pool eu, residency
    eu), no other tenant's request does (eu is reserved)."""
    # tenant-a's max_prompt_tokens is 4000 (a 400 otherwise): keep rows below it
    reqs = [r for r in load_mooncake(limit=120) if sim_prompt_tokens(r) < 4000][:60]
    assert len(reqs) >= 40
    tenants = assign_tenants(reqs, ("tenant-a", "tenant-b", "tenant-reg"), seed=4)
    assert {"tenant-reg", "tenant-a"} <= set(tenants)
    headers = {t: stack.auth(f"{t}/app") for t in set(tenants)}
    res = await replay(reqs, ReplayConfig(base_url=stack.url, time_scale=2000.0, max_tokens_cap=2,
                                          concurrency=16, request_timeout_s=20, total_timeout_s=60),
                       tenants, headers_for=headers.__getitem__)
    refused = [(e.status_code, e.policy.reason_code, e.error_code, e.latency.policy_ms)
               for e in request_events(audit_log) if e.status_code >= 500]
    assert res.errors_by_kind() == {}, refused
    for _ in range(500):  # a streamed request is audited when its stream ends, maybe after the client read it
        if len(request_events(audit_log)) >= len(reqs):
            break
        await asyncio.sleep(0.01)
    events = request_events(audit_log)
    assert len(events) == len(reqs)
    reg = [e for e in events if e.tenant == "tenant-reg"]
    other = [e for e in events if e.tenant != "tenant-reg"]
    assert reg and other
    assert {e.route.replica for e in reg} == {"r2"} and {e.route.pool for e in reg} == {"eu"}
    assert "r2" not in {e.route.replica for e in other}
    assert all(e.outcome.value == "allowed" for e in events)
    counts = replica_requests(stack)
    assert counts[2] == len(reg) and counts[0] + counts[1] == len(other)


async def test_pdp_down_gives_503_never_a_route(
    stack: Any, audit_log: Any, pdp_mode: str, opa: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ok = await stack.client.post("/v1/completions", headers=stack.auth("tenant-a/app"), json=body())
    assert ok.status_code == 200
    if opa is not None:
        opa.stop()
    else:
        def down(self: EmbeddedOpa, input: dict[str, Any]) -> Any:
            raise PolicyUnavailableError("embedded engine closed")

        monkeypatch.setattr(EmbeddedOpa, "evaluate", down)
    before = replica_requests(stack)
    # other workloads of the tenant: decision-cache misses (identity.spiffe_id is in the key)
    for workload in ("tenant-a/w5", "tenant-a/w6"):
        r = await stack.client.post("/v1/completions", headers=stack.auth(workload), json=body())
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "policy_unavailable"
    assert replica_requests(stack) == before
    failed = request_events(audit_log)[-2:]
    assert all(e.status_code == 503 and e.route.replica is None for e in failed)


async def test_pdp_slow_gives_503_within_the_deadline(
    stack: Any, audit_log: Any, pdp_mode: str, opa: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decision slower than ``policy.timeout_s`` fails closed (503) and is
    answered at the deadline, in both modes: the embedded engine with
    ``policy.offload: true`` abandons the evaluation (the inline default is
    covered by the next test)."""
    hang_s = 3.0
    if opa is not None:
        opa.slow.delay_s = hang_s
    else:
        stack.components.pdp.inner._offload = True  # what policy.offload: true configures
        real = EmbeddedOpa.evaluate

        def slow(self: EmbeddedOpa, input: dict[str, Any]) -> Any:
            time.sleep(hang_s)
            return real(self, input)

        monkeypatch.setattr(EmbeddedOpa, "evaluate", slow)
    t0 = time.monotonic()
    r = await stack.client.post("/v1/completions", headers=stack.auth("tenant-a/app"), json=body())
    elapsed = time.monotonic() - t0
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "policy_unavailable"
    assert elapsed < hang_s - 0.5  # the deadline answered, not the slow PDP
    assert replica_requests(stack) == [0, 0, 0]
    (ev,) = request_events(audit_log)
    assert ev.route.replica is None and ev.policy.reason_code == "policy_unavailable"
    # let the abandoned evaluation finish before teardown closes the engine
    await asyncio.sleep(0)


async def test_inline_embedded_decision_past_the_deadline_is_discarded(
    stack: Any, audit_log: Any, pdp_mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inline evaluation (the gateway default) cannot be preempted, but a result
    that arrives after ``policy.timeout_s`` (1 s in this directory's stacks: conftest.py) is discarded: 503,
    no route."""
    if pdp_mode != "embedded":
        pytest.skip("inline evaluation is an embedded-mode setting")
    real = EmbeddedOpa.evaluate

    def slow(self: EmbeddedOpa, input: dict[str, Any]) -> Any:
        time.sleep(1.5)
        return real(self, input)

    monkeypatch.setattr(EmbeddedOpa, "evaluate", slow)
    r = await stack.client.post("/v1/completions", headers=stack.auth("tenant-a/app"), json=body())
    assert r.status_code == 503 and r.json()["error"]["code"] == "policy_unavailable"
    assert replica_requests(stack) == [0, 0, 0]
    (ev,) = request_events(audit_log)
    assert ev.route.replica is None and ev.policy.reason_code == "policy_unavailable"


def cache_lookups(text: str) -> dict[str, float]:
    """``prefixgate_policy_cache_lookups_total`` by result, from a /metrics scrape."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("prefixgate_policy_cache_lookups_total{"):
            result = line.split('result="', 1)[1].split('"', 1)[0]
            out[result] = float(line.rsplit(" ", 1)[1])
    return out


@pytest.mark.parametrize("policy_cache_ttl_s", [600.0], ids=["ttl600"])
async def test_decision_cache_hits_across_output_lengths_and_still_clamps(
    stack: Any, audit_log: Any, pdp_mode: str
) -> None:
    """Requests that differ only in max_tokens share one decision (the policy
    returns a cap; the gateway clamps), so a replay's varying output lengths
    do not defeat the cache; the hit is an admin metric (R3-5).

    The cache's TTL is long here: the default hard TTL (1 s, wall clock) expired between the
    first and the third request on a loaded CI box (session 11: same key, no cache clear; the
    third request was a miss with a new decision id)."""
    h = stack.auth("tenant-a/app")
    for mt in (4, 5, 6000):
        assert (await stack.client.post("/v1/completions", headers=h, json=body(mt))).status_code == 200
    ids = {e.policy.decision_id for e in request_events(audit_log)}
    assert len(ids) == 1  # one evaluation, two cache hits (same decision id)
    lookups = cache_lookups(await stack.admin_metrics())  # operators only (R3-5)
    assert lookups.get("hit") == 2 and lookups.get("miss") == 1
    # tenant-a: registry cap 256 < tier cap 1024 -> the 6000-token request was clamped
    assert max(e.output_tokens or 0 for e in request_events(audit_log)) <= 256
