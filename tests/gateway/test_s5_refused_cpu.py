"""Review R5-8 / R5-2: a tenant's refused requests are bounded by a per-tenant budget of
gateway CPU (gateway/cpu_budget.py), and a batch is refused on any element's cheap bound
before any element is tokenized.

A tenant in CPU debt answers 429 ``cpu_budget_exhausted`` (``Retry-After``, audited) before
its body is parsed, while another tenant is served; accepted requests are not charged;
the bucket refills. Assertions count calls (parse, tokenizer), never time.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import pytest

import gateway.admission_front as front_mod  # the pipeline parses in its front step (session 19)
from gateway.config_http import LimitsConfig
from gateway.cpu_budget import CpuBudget
from gateway.errors import GatewayError
from tenancy.registry import Tenant
from tests.support import audit_log as audit_fixtures
from tests.support.audit_log import ListLog

audit_hub, audit_log = audit_fixtures.audit_hub, audit_fixtures.audit_log  # fixtures: the stack on a ListLog

TD = "demo.prefixgate.test"  # tests/conftest.py's trust domain


def _tenant(tid: str, **kw: Any) -> dict[str, Any]:
    return {"id": tid, "spiffe_ids": [f"spiffe://{TD}/{tid}/"], "models": ["sim-model"], "pools": ["default"], **kw}


@pytest.fixture
def config_overrides(tmp_path: Path) -> dict[str, Any]:
    key = tmp_path / "master-s5.key"
    key.write_text(secrets.token_hex(32))
    os.chmod(key, 0o600)
    return {
        "tenancy": {
            "master_secret_file": str(key),
            "tenants": [
                # a budget so small that one refused request leaves it in debt for hours
                _tenant("tenant-hog", max_prompt_tokens=100, max_output_tokens=16,
                        refused_cpu_ms_per_s=0.000001, refused_cpu_burst_ms=0.000001),
                _tenant("tenant-ok", max_prompt_tokens=100, max_output_tokens=16),
            ],
        },
    }


OVER = {"model": "sim-model", "max_tokens": 1, "prompt": " ".join(f"w{i}" for i in range(300))}  # > 100 tokens
SMALL = {"model": "sim-model", "max_tokens": 1, "prompt": "hello there"}


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the pipeline's body parses."""
    calls: list[int] = []
    real = front_mod.parse_inference_request

    def spy(raw: bytes, *a: Any, **kw: Any) -> Any:
        calls.append(len(raw))
        return real(raw, *a, **kw)

    monkeypatch.setattr(front_mod, "parse_inference_request", spy)
    return calls


class _Ticks:
    """A fake clock: each read is ``step`` seconds after the last (the same for every caller)."""

    def __init__(self, step: float = 1e-6) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def tick_clocks(budget: CpuBudget) -> _Ticks:
    """Give the gateway's CPU budget one ticking clock for both its CPU and wall reads (F15-1, session 16).

    The real thread-CPU clock charges a request's span whatever ran in it on the loop thread: a garbage
    collection, or a first use's lazy set-up, costs milliseconds of CPU, and the hog's accepted requests
    (allowance ``limits.prep_cpu_free_ms`` = 1 ms, budget 1e-9 ms) were now and then charged past the
    allowance, so its third request answered 429 where 400 was expected. With ticks, every span costs a
    few microseconds (its clock reads): an accepted request stays within the allowance, a refused one is
    charged more than the budget, whatever else the machine and the process run. ``wall_exact_s`` -1: every
    span is read on the CPU clock (the documented value for clocks that do not bound each other)."""
    ticks = _Ticks()
    budget.cpu_clock = budget.wall_clock = ticks
    budget.wall_exact_s = -1.0
    return ticks


async def test_tenant_in_cpu_debt_refused_before_parse_other_tenant_served(stack: Any, parses: list[int],
                                                                          audit_log: ListLog) -> None:
    tick_clocks(stack.components.cpu_budget)
    hog, ok = stack.auth("tenant-hog/app"), stack.auth("tenant-ok/app")
    for _ in range(2):  # accepted requests are paid in tokens: they never use the CPU budget
        r = await stack.client.post("/v1/completions", json=SMALL, headers=hog)
        assert r.status_code == 200, r.text
    r = await stack.client.post("/v1/completions", json=OVER, headers=hog)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    parsed = len(parses)
    r = await stack.client.post("/v1/completions", json=OVER, headers=hog)
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "cpu_budget_exhausted"
    assert int(r.headers["retry-after"]) >= 1
    assert len(parses) == parsed  # refused before its body was parsed
    ev = [e for e in audit_log.events if getattr(e, "request_id", None) == r.headers["x-request-id"]]
    assert len(ev) == 1 and ev[0].status_code == 429 and ev[0].error_code == "cpu_budget_exhausted"
    r = await stack.client.post("/v1/completions", json=SMALL, headers=hog)  # in debt: even a cheap one waits
    assert r.status_code == 429 and r.json()["error"]["code"] == "cpu_budget_exhausted"
    metrics = await stack.admin_metrics()
    line = next(x for x in metrics.splitlines()
                if x.startswith('prefixgate_tenant_refused_cpu_seconds_total{tenant="tenant-hog"}'))
    assert float(line.split()[-1]) > 0
    for body in (SMALL, OVER, SMALL):  # the other tenant: its own budget, untouched
        r = await stack.client.post("/v1/completions", json=body, headers=ok)
        assert r.status_code in (200, 400), r.text
        assert r.json().get("error", {}).get("code") != "cpu_budget_exhausted"


class _Clocks:
    def __init__(self) -> None:
        self.now = 100.0
        self.cpu = 0.0
        self.wall = 50.0  # the meter's wall clock: fake too, so no real gap (a loaded machine) cuts a span


def _budget(clocks: _Clocks, **limits: Any) -> CpuBudget:
    return CpuBudget(LimitsConfig(**limits), clock=lambda: clocks.now, cpu_clock=lambda: clocks.cpu,
                     wall_clock=lambda: clocks.wall)


def test_bucket_charges_refused_cpu_and_refills() -> None:
    c = _Clocks()
    b = _budget(c, refused_cpu_ms_per_s=100, refused_cpu_burst_ms=250)
    t = Tenant(id="t")

    def step() -> None:
        c.cpu += 0.4  # 400 ms of CPU in one synchronous step

    early = b.meter(t)  # made before the debt; its first step re-checks
    m = b.meter(t)
    m.run(step)
    assert m.cpu_s == pytest.approx(0.4)
    m.refused()
    m.refused()  # charged once
    with pytest.raises(GatewayError) as exc:  # 250 - 400 = -150 ms: 1.5 s to repay at 100 ms/s
        b.meter(t)
    assert exc.value.status == 429 and exc.value.code == "cpu_budget_exhausted"
    assert exc.value.headers["Retry-After"] == "2"
    with pytest.raises(GatewayError):  # a meter made before the debt refuses its first step
        early.run(step)
    c.now += 1.0
    with pytest.raises(GatewayError):
        b.meter(t)
    c.now += 0.6  # refilled past zero
    m2 = b.meter(t)
    m2.run(step)
    assert m2.cpu_s == pytest.approx(0.4)  # not refused: nothing charged
    b.meter(t)


def test_failing_step_is_measured_and_per_tenant_override_and_off() -> None:
    c = _Clocks()
    b = _budget(c, refused_cpu_ms_per_s=100, refused_cpu_burst_ms=250)
    big = Tenant(id="big", refused_cpu_ms_per_s=1000, refused_cpu_burst_ms=1000)

    def boom() -> None:
        c.cpu += 0.5
        raise GatewayError(400, "context_length_exceeded", "x")

    m = b.meter(big)
    with pytest.raises(GatewayError):
        m.run(boom)
    m.refused()
    b.meter(big)  # 1000 - 500 ms: still in credit under its own burst
    off = _budget(c, refused_cpu_ms_per_s=None)
    m = off.meter(Tenant(id="t"))
    with pytest.raises(GatewayError):
        m.run(boom)
    m.refused()
    off.meter(Tenant(id="t"))  # no budget configured: never refused


class _CountingTokenizer:
    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.chars = inner, inner.name, []

    def encode(self, text: str, *a: Any, **kw: Any) -> list[int]:
        self.chars.append(len(text))
        return self.inner.encode(text, *a, **kw)

    def max_text_bytes(self, tokens: int) -> int:
        return self.inner.max_text_bytes(tokens)

    def max_messages(self, tokens: int) -> int:
        return self.inner.max_messages(tokens)


async def test_batch_refused_on_any_elements_bound_before_tokenizing_any(stack: Any,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    adm = stack.components.admission
    tok = _CountingTokenizer(adm.tokenizer)
    monkeypatch.setattr(adm, "tokenizer", tok)
    limit_bytes = adm.request_bounds(stack.components.registry.get("tenant-ok")).max_prompt_bytes
    within = " ".join(["w"] * 90)  # 90 tokens: within the limit
    over = "w " * (limit_bytes // 2 + 1)  # over the byte bound of 100 tokens
    r = await stack.client.post("/v1/completions", json={"model": "sim-model", "max_tokens": 1,
                                                         "prompt": [within, within, over]},
                                headers=stack.auth("tenant-ok/app"))
    assert r.status_code == 400 and r.json()["error"]["code"] == "prompt_too_large", r.text
    assert tok.chars == []  # no element was tokenized
