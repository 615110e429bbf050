"""Review R12-3: with an ``hf:`` tokenizer, a long prompt is tokenized on the tokenizer thread
(gateway/tokenize_thread.py) while the event loop serves other tenants, and the thread's CPU is
charged like an inline step's.

The gateway's tokenizer is a small byte-level BPE trained in process. Its ``tokenizers`` object is
wrapped so that the long prompt's encode blocks until the test releases it: if the encode ran on
the event loop, the loop would stall inside it (up to 10 s, then the request fails) and the other
tenant's request could not be served meanwhile.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.waiting import wait_for

LETTERS = "abcdefghijklmnopqrstuvwxyz"


#: 300 made-up words: the trained BPE learns each as one token (~7 bytes a token with its space)
DICTIONARY = ["".join(random.Random(i).choice(LETTERS) for _ in range(3 + i % 7)) for i in range(300)]


def _words(rnd: random.Random, n: int) -> str:
    return " ".join(rnd.choice(DICTIONARY) for _ in range(n))


@pytest.fixture
def config_overrides(tmp_path: Path) -> dict[str, Any]:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    rnd = random.Random(5)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator([_words(rnd, 50) for _ in range(400)], trainers.BpeTrainer(
        vocab_size=2000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return {"routing": {"policy": "cache_aware", "block_size": 16, "tokenizer": f"hf:{path}"},
            "limits": {"refused_cpu_ms_per_s": 1, "refused_cpu_burst_ms": 50}}


class Gate:
    """Wraps the ``tokenizers`` object: ``encode_batch`` (long texts) waits for :attr:`release`
    and may burn ``burn_s`` of its thread's CPU; records the thread it ran on."""

    def __init__(self, inner: Any, burn_s: float = 0.0) -> None:
        self.inner = inner
        self.burn_s = burn_s
        self.started = threading.Event()
        self.release = threading.Event()
        self.threads: list[threading.Thread] = []

    def encode(self, text: str, **kw: Any) -> Any:
        return self.inner.encode(text, **kw)

    def encode_batch(self, texts: list[str], **kw: Any) -> Any:
        self.threads.append(threading.current_thread())
        self.started.set()
        if not self.release.wait(10):
            raise RuntimeError("never released: the encode blocked the event loop")
        t0 = time.thread_time()
        while time.thread_time() - t0 < self.burn_s:
            pass
        return self.inner.encode_batch(texts, **kw)


def _body(prompt: str) -> dict[str, Any]:
    return {"model": "sim-model", "prompt": prompt, "max_tokens": 4}


async def test_a_long_prompt_is_tokenized_off_the_loop_while_another_tenant_is_served(
        stack: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    hf = stack.components.admission.tokenizer
    assert getattr(hf, "releases_gil", False) and stack.components.tokenize_thread is not None
    gate = Gate(hf._tok)
    monkeypatch.setattr(hf, "_tok", gate)
    long_prompt = _words(random.Random(1), 3000)  # ~20 KiB, ~6,000 tokens: above GIL_FREE_CHARS, under 8,192
    big = asyncio.ensure_future(stack.client.post("/v1/completions", json=_body(long_prompt),
                                                  headers=stack.auth("tenant-b/app")))
    assert await wait_for(gate.started.is_set, timeout_s=10.0)
    small = await stack.client.post("/v1/completions", json=_body("hello there"), headers=stack.auth())
    assert small.status_code == 200, small.text  # served while the long prompt's encode is held
    assert not big.done()
    gate.release.set()
    r = await big
    assert r.status_code == 200, r.text
    assert gate.threads and gate.threads[0] is not threading.main_thread()


async def test_the_tokenizer_threads_cpu_is_charged_to_a_refused_request(
        stack: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """tenant-a's limit is 4,000 prompt tokens: a 30,000-byte prompt is over it (400) and its preparation
    is charged to tenant-a's CPU budget (burst 50 ms here), including the 80 ms its encode burns on
    the thread: the budget is in debt, so tenant-a's next request is refused 429
    ``cpu_budget_exhausted`` (uncharged, the parse alone, a few ms, would leave it positive)."""
    hf = stack.components.admission.tokenizer
    gate = Gate(hf._tok, burn_s=0.08)
    gate.release.set()
    monkeypatch.setattr(hf, "_tok", gate)
    prompt = _words(random.Random(2), 5000)[:30_000]  # above GIL_FREE_CHARS, under tenant-a's byte bound
    r = await stack.client.post("/v1/completions", json=_body(prompt), headers=stack.auth())
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    assert gate.threads and gate.threads[0] is not threading.main_thread()
    nxt = await stack.client.post("/v1/completions", json=_body("hello there"), headers=stack.auth())
    assert nxt.status_code == 429 and nxt.json()["error"]["code"] == "cpu_budget_exhausted", nxt.text


async def test_a_request_cancelled_while_its_step_runs_is_charged_when_the_step_ends() -> None:
    """The thread cannot be interrupted: a client that leaves mid-step ends its request (charged what
    was measured so far, ~0), and the step's CPU is charged to the tenant when the step ends."""
    from gateway.config_http import LimitsConfig
    from gateway.cpu_budget import CpuBudget
    from gateway.errors import GatewayError
    from gateway.tokenize_thread import TokenizeThread
    from tenancy.registry import Tenant

    budget = CpuBudget(LimitsConfig(refused_cpu_ms_per_s=1, refused_cpu_burst_ms=50))
    tenant = Tenant(id="t")
    meter = budget.meter(tenant)
    started, release = threading.Event(), threading.Event()

    def step() -> str:
        started.set()
        release.wait(10)
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.08:
            pass
        return "ids"

    thread = TokenizeThread()
    task = asyncio.ensure_future(thread.run(meter, step))
    assert await wait_for(started.is_set, timeout_s=10.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    meter.settle(dispatched=False, prompt_tokens=0)  # the request's end: its refusal charge (~0 so far)
    budget.check(tenant)  # not in debt yet
    release.set()

    def in_debt() -> bool:
        try:
            budget.check(tenant)
        except GatewayError as err:
            return err.status == 429
        return False

    assert await wait_for(in_debt, timeout_s=10.0)
    await thread.stop()


class _Meter:
    """A stand-in for :class:`gateway.cpu_budget.CpuMeter`: records the budget checks of its steps and
    raises 429 at the ``refuse_at``-th one."""

    def __init__(self, tenant_id: str, refuse_at: int | None = None) -> None:
        from tenancy.registry import Tenant

        self.tenant = Tenant(id=tenant_id)
        self.checks: list[bool] = []
        self.refuse_at = refuse_at

    def check_step(self, always: bool = False) -> Any:
        from gateway.errors import GatewayError

        self.checks.append(always)
        if self.refuse_at is not None and len(self.checks) == self.refuse_at:
            raise GatewayError(429, "cpu_budget_exhausted", "in debt")
        return time.thread_time

    def add_off_loop(self, cpu_s: float, late: bool = False) -> None:
        pass


async def test_one_step_per_tenant_on_the_thread_and_the_budget_rechecked_at_each_turn() -> None:
    """R12b-1: tenant a's five big prompts no longer all queue on the thread ahead of tenant b's one:
    b's step runs second, right after a's first; and a's budget is checked at each of its turns (its
    fourth is refused 429 without running)."""
    from gateway.errors import GatewayError
    from gateway.tokenize_thread import TokenizeThread

    thread = TokenizeThread()
    order: list[str] = []
    first_started, release_first = threading.Event(), threading.Event()

    def step(name: str) -> str:
        if name == "a1":
            first_started.set()
            release_first.wait(10)
        order.append(name)
        return name

    a, b = _Meter("a", refuse_at=4), _Meter("b")
    a_tasks = [asyncio.ensure_future(thread.run(a, step, f"a{i}")) for i in range(1, 6)]
    assert await wait_for(first_started.is_set, timeout_s=10.0)
    b_task = asyncio.ensure_future(thread.run(b, step, "b1"))
    assert await wait_for(lambda: len(b.checks) == 1, timeout_s=10.0)  # b's step is on the thread's queue
    release_first.set()
    assert await b_task == "b1"
    results = await asyncio.gather(*a_tasks, return_exceptions=True)
    assert order[:2] == ["a1", "b1"]
    assert [r if isinstance(r, str) else r.code for r in results] == ["a1", "a2", "a3", "cpu_budget_exhausted", "a5"]
    assert isinstance(results[3], GatewayError) and "a4" not in order
    assert a.checks == [True] * 5
    await thread.stop()
