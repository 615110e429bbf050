"""Review finding R3-2: a tenant in prompt-token debt is refused before its prompt is tokenized.

Before the fix every request was tokenized in full and only then refused 429
``token_rate_limited`` by the ledger, so a tenant whose prompt-token bucket was empty
could still make the gateway tokenize ~1 MiB per request (~107 ms CPU each on the one
event loop). Now admission reads the bucket first: a prompt whose size alone proves it
holds more tokens than the bucket can admit is refused without tokenizing, and any other
prompt is tokenized with ``limit = min(max_prompt_tokens, tokens the bucket admits now)``
(O(budget), not O(prompt)). An admitted request's count stays exact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tenancy.ledger import InProcessLedger
from tenancy.prompt_room import PromptRoom, min_tokens
from tenancy.registry import Tenant
from tenancy.tokenizer import WordTokenizer
from tests.conftest import TD
from tests.support.audit_log import audit_hub, audit_log  # noqa: F401 - fixtures: the stack audits to a ListLog
from tests.support.waiting import wait_for

RATE = 1 / 60  # one token a minute: the bucket does not refill during a test


class _Spy:
    """Wraps the gateway's tokenizer: records (text length, limit, ids produced) of each call."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.calls: list[tuple[int, int | None, int]] = []

    def encode(self, text: str, limit: int | None = None) -> list[int]:
        ids: list[int] = self.inner.encode(text, limit)
        self.calls.append((len(text), limit, len(ids)))
        return ids

    def max_text_bytes(self, tokens: int) -> int:
        return int(self.inner.max_text_bytes(tokens))

    def max_messages(self, tokens: int) -> int:
        return int(self.inner.max_messages(tokens))


def _tenant(tid: str, **limits: Any) -> dict[str, Any]:
    return {"id": tid, "spiffe_ids": [f"spiffe://{TD}/{tid}/"], "models": ["sim-model"], "pools": ["default"],
            "max_output_tokens": 64, **limits}


@pytest.fixture
def n_replicas() -> int:
    return 1


@pytest.fixture
def config_overrides(tmp_path: Path) -> dict[str, Any]:
    return {"tenancy": {"tenants": [
        _tenant("tenant-a", prompt_tokens_per_s=RATE, prompt_tokens_burst=100),
        _tenant("tenant-b", prompt_tokens_per_s=RATE, prompt_tokens_burst=1000, max_prompt_tokens=5000),
        _tenant("tenant-c"),
    ]}, "limits": {"max_prompt_tokens": None}}  # s4: no gateway default, so tenant-a/c have no token bound at all


def _words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


async def _post(stack: Any, tenant: str, prompt: str) -> Any:
    log = stack.components.audit.log
    before = len(log.events)
    r = await stack.client.post("/v1/completions", json={"model": "sim-model", "prompt": prompt, "max_tokens": 4},
                                headers=stack.auth(f"{tenant}/app"))
    await wait_for(lambda: len(log.events) > before, what="the audit event")
    (r.event,) = log.events[before:]  # one request, one audit event
    return r


def _spy(stack: Any) -> _Spy:
    adm = stack.components.admission
    spy = _Spy(adm.tokenizer)
    adm.tokenizer = spy
    return spy


async def test_a_tenant_in_debt_is_refused_before_its_huge_prompt_is_tokenized(stack: Any) -> None:
    spy = _spy(stack)
    r = await _post(stack, "tenant-a", _words(500))  # a full bucket admits it into debt (-400)
    assert r.status_code == 200, r.text
    assert spy.calls[-1][1] is None and spy.calls[-1][2] == 500  # full bucket, no max_prompt_tokens: whole text
    spy.calls.clear()
    huge = "a " * 520_000  # ~1 MiB, 520000 tokens
    r = await _post(stack, "tenant-a", huge)
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "token_rate_limited"
    assert int(r.headers["Retry-After"]) >= 1
    assert spy.calls == []  # its size alone proves it holds more tokens than the bucket admits
    ev = r.event
    assert (ev.status_code, ev.error_code, ev.tenant) == (429, "token_rate_limited", "tenant-a")
    # a small prompt in debt: tokenized with limit 0 (one token looked at), refused the same way
    r = await _post(stack, "tenant-a", _words(10))
    assert r.status_code == 429 and r.json()["error"]["code"] == "token_rate_limited"
    assert spy.calls and all(limit == 0 and produced <= 1 for _, limit, produced in spy.calls), spy.calls


async def test_the_tokenizing_work_is_bounded_by_what_the_bucket_admits(stack: Any) -> None:
    spy = _spy(stack)
    r = await _post(stack, "tenant-b", _words(100))  # full bucket (1000): limit = max_prompt_tokens
    assert r.status_code == 200, r.text
    assert spy.calls[-1][1:] == (5000, 100)
    r = await _post(stack, "tenant-b", _words(60))  # 900 left: tokenized with limit 900, exact count
    assert r.status_code == 200, r.text
    _, limit, produced = spy.calls[-1]
    assert 900 <= limit < 902 and produced == 60
    ev = r.event
    assert ev.prompt_tokens == 60 and ev.status_code == 200
    spy.calls.clear()
    r = await _post(stack, "tenant-b", _words(2000))  # 840 left: over the bucket, below max_prompt_tokens
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "token_rate_limited" and int(r.headers["Retry-After"]) >= 1
    ((_, limit, produced),) = spy.calls
    assert 840 <= limit < 842 and produced == limit + 1  # stopped after limit + 1 tokens, not 2000
    ev = r.event
    assert (ev.status_code, ev.error_code) == (429, "token_rate_limited")
    r = await _post(stack, "tenant-b", _words(840))  # exactly what is left: admitted, exact
    assert r.status_code == 200, r.text
    assert r.event.prompt_tokens == 840


async def test_a_tenant_without_token_limits_is_unaffected(stack: Any) -> None:
    spy = _spy(stack)
    r = await _post(stack, "tenant-c", _words(3000))
    assert r.status_code == 200, r.text
    assert spy.calls[-1][1:] == (None, 3000)


def test_the_ledger_states_what_the_prompt_bucket_admits_now() -> None:
    led = InProcessLedger(clock=lambda: 0.0)
    t = Tenant(id="t", spiffe_ids=("spiffe://x.test/t/",), prompt_tokens_per_s=10.0, prompt_tokens_burst=100)
    assert led.prompt_room(t, 0.0) is None  # a fresh bucket is full and admits any prompt (into debt)
    led.reserve(t, 30, 0, 0.0)
    assert led.prompt_room(t, 0.0) == PromptRoom(70, 70.0, 100.0, 10.0)
    assert led.prompt_room(t, 1.0) == PromptRoom(80, 80.0, 100.0, 10.0)  # refilled 10/s
    assert led.prompt_room(t, 9.0) is None  # full again
    led.reserve(t, 500, 0, 9.0)
    room = led.prompt_room(t, 9.0)
    assert room == PromptRoom(0, -400.0, 100.0, 10.0)
    assert room.wait_s(5) == pytest.approx(40.5) and room.wait_s(10**6) == pytest.approx(50.0)  # min(n, burst)
    assert led.prompt_room(Tenant(id="u", spiffe_ids=("spiffe://x.test/u/",)), 0.0) is None  # no limit


def test_min_tokens_is_a_lower_bound_from_the_size() -> None:
    tok = WordTokenizer()
    assert min_tokens(tok, 0) == 0 and min_tokens(tok, 448) == 0 and min_tokens(tok, 449) == 1
    assert min_tokens(tok, 1_040_000) == 2321  # "a " x 520000: 520000 tokens, at least 2321 by size
    for nbytes in (1, 900, 5000, 10**6):
        t = min_tokens(tok, nbytes, texts=2)
        assert tok.max_text_bytes(t + 1) >= nbytes and (t == 0 or tok.max_text_bytes(t) < nbytes)


def test_word_tokenizer_byte_bound_refuses_only_what_cannot_fit() -> None:
    tok = WordTokenizer()
    for cap in (0, 1, 7, 100):
        worst = ("x" * 64 + " " * 64) * (cap + 1)  # cap + 1 longest tokens with the longest free separators
        assert len(tok.encode(worst, cap)) == cap + 1
        assert len(worst.encode()) <= tok.max_text_bytes(cap + 1)


@pytest.mark.parametrize("mode", ["local", "fail_closed"])
def test_with_redis_only_the_local_view_of_an_outage_is_read(mode: str) -> None:
    from tenancy.shared_failover import Availability, FailoverLedger

    av = Availability(lambda: None, mode=mode, instances=2, probe_interval_s=1.0)
    led = FailoverLedger(shared=None, availability=av)  # type: ignore[arg-type]  # never called here
    t = Tenant(id="t", spiffe_ids=("spiffe://x.test/t/",), prompt_tokens_per_s=10.0, prompt_tokens_burst=100)
    led.local.reserve(av.scaled(t), 500, 0)
    assert led.prompt_room(t) is None  # Redis answers: the shared level is not read (no extra round trip)
    av.available = False
    room = led.prompt_room(t)
    if mode == "fail_closed":
        assert room is None  # refused 503 anyway at the reservation
    else:
        assert room is not None and room.cap == 0 and room.burst == 50.0  # the local bucket, limits / instances
