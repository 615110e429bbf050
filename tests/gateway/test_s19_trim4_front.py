"""Session 19 (issue 14, helper trim4): the front as one metered step, and the output clamp called directly.

``gateway.admission_front.parse_and_count`` replaces gateway/pipeline.py's parse -> ``check_request`` ->
``prompt_room`` -> ``prompt_tokens`` (two ``CpuMeter.run`` steps, four Admission calls). Differential against
session 18's order, written out here as it was: for each body and tenant, the same answer (the tokens and count,
or the same refusal: status, code, message, param, headers, outcome) and the same audit record (every field of
the :class:`RequestRecord` after ``refused``; ``t_parsed``: set or not). A one-step meter closes its span at the
end of its step as the two-step one did at the end of the second. ``clamp_output`` with the tenant's and
gateway's caps = ``Admission.output_cap`` / ``clamp_max_tokens``. Through a served stack: the refusals' audit
records carry stream, sequences, model and t_parsed as the steps set them.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from gateway.admission import Admission
from gateway.admission_answers import clamp_output
from gateway.admission_front import parse_and_count
from gateway.config_http import LimitsConfig
from gateway.config_state import StateConfig
from gateway.cpu_budget import CpuBudget
from gateway.errors import GatewayError
from gateway.metrics import GatewayMetrics
from gateway.record import RequestRecord
from gateway.request import parse_inference_request
from policy.decision import Decision
from tenancy.hf_tokenizer import GIL_FREE_CHARS
from tenancy.registry import Tenant, TenantRegistry
from tenancy.shared import make_limits
from tenancy.tokenizer import WordTokenizer
from tests.gateway.test_s13_meter_reads import _Clocks  # a CPU and wall clock a test advances

LIMITS = LimitsConfig()
TD = "demo.prefixgate.test"
SERVED = ["m", "served-only"]


def _admission() -> Admission:
    return Admission(TenantRegistry.from_config([]), make_limits(StateConfig()), WordTokenizer(), SERVED,
                     GatewayMetrics(), max_messages=64, max_output_tokens=4096, default_max_prompt_tokens=200)


TENANTS = {
    "plain": Tenant(id="plain", models=frozenset({"m", "entitled-unserved"})),
    "small": Tenant(id="small", models=frozenset({"m"}), max_prompt_tokens=8, max_prompt_bytes=60,
                    max_batch_prompts=3),
    "logprobs": Tenant(id="logprobs", models=frozenset({"m"}), allow_prompt_logprobs=True),
    # a prompt-token bucket drained to 5 tokens (refills 1/s): prompt_room is not None, 429 past it
    "metered": Tenant(id="metered", models=frozenset({"m"}), prompt_tokens_per_s=1.0, prompt_tokens_burst=100.0),
}


def _drained(adm: Admission) -> None:
    adm.check_prompt_now(TENANTS["metered"], 95, 1, 0)


def _old_front(adm: Admission, rec: RequestRecord, raw: bytes, endpoint: str, tenant: Tenant, lease: Any) -> Any:
    """gateway/pipeline.py's steps of session 18 (main afd63e3), the batch's await left out."""
    bounds = adm.request_bounds(tenant)
    req = parse_inference_request(raw, endpoint, LIMITS.max_json_depth,  # type: ignore[arg-type]
                                  max_messages=bounds.max_messages, max_batch_prompts=bounds.max_batch_prompts,
                                  max_json_items=LIMITS.max_json_items)
    seqs = len(req.prompts) or 1
    rec.stream, rec.sequences = req.stream, seqs
    rec.dropped_fields = req.dropped[0]  # session 24 (S23-fields-4): the steps record it with the parse's facts
    adm.check_request(req, tenant)
    rec.model = req.model
    if seqs > 1:
        return "step by step", req.model, seqs
    rec.t_parsed = time.perf_counter()
    room = adm.prompt_room(tenant, lease)
    tokens, prompt_tokens = adm.prompt_tokens(bounds, req, room)
    rec.prompt_tokens = prompt_tokens
    return tokens, prompt_tokens


def _new_front(adm: Admission, rec: RequestRecord, raw: bytes, endpoint: str, tenant: Tenant, lease: Any,
               thread: bool = False) -> Any:
    """gateway/pipeline.py's use of :func:`parse_and_count` (session 19)."""
    bounds = adm.request_bounds(tenant)
    req, seqs, tokens, prompt_tokens, rec.t_parsed = parse_and_count(adm, raw, endpoint,  # type: ignore[arg-type]
                                                                     LIMITS, bounds, tenant, lease, thread)
    rec.stream, rec.sequences, rec.model, rec.dropped_fields = req.stream, seqs, req.model, req.dropped[0]
    if tokens is None:
        assert rec.t_parsed is None
        return "step by step", req.model, seqs
    rec.prompt_tokens = prompt_tokens
    return tokens, prompt_tokens


def _run(front: Any, adm: Admission, raw: bytes, endpoint: str, tenant: Tenant) -> tuple[Any, dict[str, Any]]:
    rec = RequestRecord(request_id="r", endpoint="/v1/x", client_addr="c", t0=1.0)
    try:
        out: Any = front(adm, rec, raw, endpoint, tenant, None)
    except GatewayError as err:
        rec.refused(err)
        out = ("refused", err.status, err.code, err.message, err.param, err.headers, err.outcome, err.err_type)
    fields = {f.name: getattr(rec, f.name) for f in dataclasses.fields(RequestRecord)}
    fields["t_parsed"] = fields["t_parsed"] is not None
    return out, fields


def _both(raw: bytes, endpoint: str, tenant_name: str) -> tuple[Any, dict[str, Any]]:
    old_adm, new_adm = _admission(), _admission()
    _drained(old_adm)
    _drained(new_adm)
    tenant = TENANTS[tenant_name]
    old = _run(_old_front, old_adm, raw, endpoint, tenant)
    new = _run(_new_front, new_adm, raw, endpoint, tenant)
    assert new == old
    return new


def _body(**fields: Any) -> bytes:
    return json.dumps({"model": "m", "prompt": "one two three", **fields}).encode()


CASES = [
    ("served", _body(), "completions", "plain"),
    ("stream", _body(stream=True), "completions", "plain"),
    ("chat", json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi there"}]}).encode(), "chat",
     "plain"),
    ("not json", b'{"model": "m", "prompt": ', "completions", "plain"),
    ("no model field", json.dumps({"prompt": "x"}).encode(), "completions", "plain"),
    ("unserved", _body(model="nope"), "completions", "plain"),
    ("entitled, unserved", _body(model="entitled-unserved"), "completions", "plain"),
    ("served, not entitled", _body(model="served-only"), "completions", "plain"),
    ("echo + logprobs", _body(echo=True, logprobs=1), "completions", "plain"),
    ("echo + logprobs allowed", _body(echo=True, logprobs=1), "completions", "logprobs"),
    ("echo alone", _body(echo=True), "completions", "plain"),
    ("bytes over", _body(prompt="x" * 61), "completions", "small"),
    ("tokens over", _body(prompt="a b c d e f g h i j"), "completions", "small"),
    ("default tokens over", _body(prompt="w " * 201), "completions", "plain"),
    ("room: fits", _body(prompt="a b c"), "completions", "metered"),
    ("room: over by count", _body(prompt="a b c d e f g"), "completions", "metered"),
    ("room: over by size", _body(prompt="word " * 400), "completions", "metered"),
    ("batch", _body(prompt=["a b", "c d"]), "completions", "plain"),
    ("batch over its bound", _body(prompt=["a"] * 4), "completions", "small"),
    ("batch, not entitled", _body(model="served-only", prompt=["a", "b"]), "completions", "plain"),
    ("empty prompt", _body(prompt=""), "completions", "plain"),
    ("bad max_tokens", _body(max_tokens=0), "completions", "plain"),
]


@pytest.mark.parametrize(("name", "raw", "endpoint", "tenant"), CASES, ids=[c[0] for c in CASES])
def test_the_fused_front_answers_and_records_as_the_steps(name: str, raw: bytes, endpoint: str, tenant: str) -> None:
    out, rec = _both(raw, endpoint, tenant)
    refused = out[0] == "refused"
    # the cases cover each step's refusal and its record: what the steps had set before it, no more
    expect = {
        "not json": (False, None, None, False), "no model field": (False, None, None, False),
        "bad max_tokens": (False, None, None, False),
        "unserved": (True, 1, None, False), "entitled, unserved": (True, 1, None, False),
        "served, not entitled": (True, 1, "served-only", False), "echo + logprobs": (True, 1, None, False),
        "bytes over": (True, 1, "m", True), "tokens over": (True, 1, "m", True),
        "default tokens over": (True, 1, "m", True), "room: over by count": (True, 1, "m", True),
        "room: over by size": (True, 1, "m", True), "batch over its bound": (False, None, None, False),
        "batch, not entitled": (True, 2, "served-only", False), "empty prompt": (False, None, None, False),
    }
    if name in expect:
        assert refused, out
        _, seqs, model, parsed = expect[name]
        assert (rec["sequences"], rec["model"], rec["t_parsed"]) == (seqs, model, parsed)
    else:
        assert not refused, out


_words = st.lists(st.sampled_from(["a", "bb", "ccc", "ü", "\u4e2d"]), min_size=0, max_size=14).map(" ".join)


@settings(max_examples=150, deadline=None)
@given(prompt=st.one_of(_words, st.lists(_words, min_size=1, max_size=4)), model=st.sampled_from(
    ["m", "nope", "served-only", "entitled-unserved"]), tenant=st.sampled_from(sorted(TENANTS)),
    stream=st.booleans(), echo=st.sampled_from([None, True, False]), logprobs=st.sampled_from([None, 0, 2]))
def test_the_fused_front_is_the_steps_on_any_request(prompt: Any, model: str, tenant: str, stream: bool,
                                                     echo: bool | None, logprobs: int | None) -> None:
    fields: dict[str, Any] = {"model": model, "prompt": prompt, "stream": stream}
    if echo is not None:
        fields["echo"] = echo
    if logprobs is not None:
        fields["logprobs"] = logprobs
    _both(json.dumps(fields).encode(), "completions", tenant)


def test_a_prompt_tokenized_off_the_loop_stops_after_the_entitlement() -> None:
    """With a tokenizer thread and a GIL-free tokenizer, a long prompt goes on step by step (R12-3)."""
    adm = _admission()

    class _GilFree(WordTokenizer):
        releases_gil = True

    adm.tokenizer = _GilFree()
    rec = RequestRecord(request_id="r", endpoint="/v1/x", client_addr="c", t0=1.0)
    big = Tenant(id="big", models=frozenset({"m"}), max_prompt_tokens=100_000)
    long = _body(prompt="a " * (GIL_FREE_CHARS // 2))  # GIL_FREE_CHARS bytes
    assert _new_front(adm, rec, long, "completions", big, None, thread=True)[0] == "step by step"
    assert _new_front(adm, rec, long, "completions", big, None, thread=False)[1] == GIL_FREE_CHARS // 2
    assert _new_front(adm, rec, _body(), "completions", big, None, thread=True)[1] == 3


def _budget(c: _Clocks) -> CpuBudget:
    return CpuBudget(LimitsConfig(refused_cpu_ms_per_s=100, refused_cpu_burst_ms=1000, prep_cpu_free_ms=1.0,
                                  prep_cpu_free_us_per_token=0.0),
                     clock=lambda: 100.0, cpu_clock=c.read_cpu, wall_clock=lambda: c.wall, wall_bounds_cpu=True)


@pytest.mark.parametrize("long", [False, True])
def test_a_one_step_meter_measures_as_the_two_step_one(long: bool) -> None:
    """The fused step alone (steps=1) is charged what parse + gap + tokenize were (steps=2), with as many
    thread-CPU reads; a later step (a batch's, after its await) is a span of its own."""
    s = 0.0004 if long else 0.00004
    two, one = _Clocks(), _Clocks()
    b2, b1 = _budget(two), _budget(one)
    m2, m1 = b2.meter(Tenant(id="t")), b1.meter(Tenant(id="t"), 1)
    m2.run(two.work, s)
    two.work(0.000005)
    m2.run(two.work, s)
    m1.run(lambda: (one.work(s), one.work(0.000005), one.work(s)))
    assert (m1.cpu_s, one.cpu_reads) == pytest.approx((m2.cpu_s, two.cpu_reads))
    one.wall += 1.0  # the batch's await
    m1.run(one.work, s)
    assert m1.cpu_s == pytest.approx(m2.cpu_s + s)
    m1.refused()
    assert b1.buckets["t"].level == pytest.approx(1.0 - m1.cpu_s)


@settings(max_examples=200, deadline=None)
@given(requested=st.one_of(st.none(), st.integers(1, 10_000)), tenant_cap=st.one_of(st.none(), st.integers(1, 9000)),
       policy_cap=st.one_of(st.none(), st.integers(1, 9000)), gateway_cap=st.integers(1, 9000))
def test_clamp_output_called_directly_is_the_admission_wrappers(requested: int | None, tenant_cap: int | None,
                                                               policy_cap: int | None, gateway_cap: int) -> None:
    adm = _admission()
    adm.max_output_tokens = gateway_cap
    tenant = Tenant(id="t", max_output_tokens=tenant_cap)
    decision = Decision(allow=True, reason_code="ok", reason="ok", allowed_replicas=None, allowed_pools=None,
                        max_tokens=policy_cap, decision_id="d")
    assert clamp_output(requested, tenant.max_output_tokens, None, adm.max_output_tokens) == \
        adm.output_cap(requested, tenant)
    assert clamp_output(requested, tenant.max_output_tokens, decision.max_tokens, adm.max_output_tokens) == \
        adm.clamp_max_tokens(requested, tenant, decision)


async def test_served_refusals_keep_their_record_fields(stack: Any, monkeypatch: Any) -> None:
    """Through the pipeline: each refusal of the front step carries what the steps had set (tenant-a:
    max_prompt_tokens 4000, model sim-model)."""
    records: list[Any] = []
    emit = stack.components.audit.emit_request
    monkeypatch.setattr(stack.components.audit, "emit_request", lambda rec: (records.append(rec), emit(rec)))
    cases = [
        (b'{"model": "sim-model", "prompt": ', 400, "invalid_json", (False, None, None, False)),
        (json.dumps({"model": "nope", "prompt": "a", "stream": True}).encode(), 404, "model_not_found",
         (True, 1, None, False)),
        (json.dumps({"model": "sim-model", "prompt": "a", "echo": True, "logprobs": 1}).encode(), 400,
         "prompt_logprobs_not_allowed", (False, 1, None, False)),
        (json.dumps({"model": "sim-model", "prompt": "w " * 4001}).encode(), 400, "context_length_exceeded",
         (False, 1, "sim-model", True)),
        (json.dumps({"model": "sim-model", "prompt": ["a b", "c d"], "max_tokens": 2}).encode(), 200, None,
         (False, 2, "sim-model", True)),
        (json.dumps({"model": "sim-model", "prompt": "a b c", "max_tokens": 2}).encode(), 200, None,
         (False, 1, "sim-model", True)),
    ]
    for body, status, code, (stream, seqs, model, parsed) in cases:
        r = await stack.client.post("/v1/completions", content=body,
                                    headers={**stack.auth(), "content-type": "application/json"})
        assert r.status_code == status, r.text
        rec = records[-1]
        assert (rec.status, rec.error_code) == (status, code)
        assert (rec.stream, rec.sequences, rec.model, rec.t_parsed is not None) == (stream, seqs, model, parsed)
        if parsed:
            assert rec.t_auth <= rec.t_parsed <= (rec.t_keys or rec.t_end)


async def test_the_tenant_authn_found_is_the_one_admission_resolves(stack: Any, monkeypatch: Any) -> None:
    """F18-1: a verified-token hit hands on the tenant its unmapped-identity check found; the record (tenant,
    identity, refusal) is what ``Admission.resolve_tenant`` gave, also for an unmapped workload (403) and right
    after a registry reload that moves the workload to another tenant (the hit's lookup is the new registry's)."""
    import yaml

    gw = stack.components
    records: list[Any] = []
    emit = gw.audit.emit_request
    monkeypatch.setattr(gw.audit, "emit_request", lambda rec: (records.append(rec), emit(rec)))
    resolved: list[Any] = []
    real = gw.admission.resolve_tenant
    monkeypatch.setattr(gw.admission, "resolve_tenant", lambda identity: resolved.append(1) or real(identity))
    body = {"model": "sim-model", "prompt": "a b c", "max_tokens": 2}
    a, stranger = stack.auth(), stack.auth("stranger/app")

    async def post(headers: dict[str, str]) -> tuple[int, Any]:
        r = await stack.client.post("/v1/completions", json=body, headers=headers)
        rec = records[-1]
        return r.status_code, (rec.tenant_id, rec.spiffe_id, rec.status, rec.error_code, rec.outcome)

    sid = f"spiffe://{TD}/tenant-a/app"
    assert await post(a) == (200, ("tenant-a", sid, 200, None, "allowed"))  # a miss: verified, then resolved
    assert resolved == [1]
    assert await post(a) == (200, ("tenant-a", sid, 200, None, "allowed"))  # a hit: the tenant authn found
    assert resolved == [1]
    for _ in range(2):  # unmapped (verified once, then a hit): resolve_tenant answers the 403 as before
        assert await post(stranger) == (403, (None, f"spiffe://{TD}/stranger/app", 403, "unknown_workload", "denied"))
    p = stack.tmp / "gateway.yaml"
    doc = yaml.safe_load(p.read_text())
    for t in doc["tenancy"]["tenants"]:
        if t["id"] == "tenant-a":
            t["spiffe_ids"] = [f"spiffe://{TD}/elsewhere/"]
        if t["id"] == "tenant-b":
            t["spiffe_ids"] = [*t["spiffe_ids"], f"spiffe://{TD}/tenant-a/"]
    p.write_text(yaml.safe_dump(doc))
    r = await stack.client.post(f"{stack.admin_url}/admin/tenants/reload", headers=stack.operator_auth())
    assert r.status_code == 200, r.text
    assert await post(a) == (200, ("tenant-b", sid, 200, None, "allowed"))  # a hit, after the reload

