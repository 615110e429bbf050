"""Session 31 (offload31, narrowed by the lead: S31-lead-2; S30-review30-3): a body that may hold a ``pattern`` key
(spelt as is or with escaped ASCII letters), whose count can hold the loop ~100 ms, is prepared on
the gateway's worker thread (gateway/prep_thread.py), while a plain body is prepared on the event loop as before.

The count of a pattern is held by a gate (:class:`Gate`, wrapping :func:`gateway.pattern_states.pattern_states`)
until the test releases it: had the count run on the event loop, the loop would stall inside it (up to 10 s, then the
gate raises) and the other tenant's request could not be served meanwhile. Ordering and conditions only: no timing.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from typing import Any

import pytest

from tests.support.waiting import wait_for

PATH = "/v1/chat/completions"
JSON = {"Content-Type": "application/json"}


def _chat(content: str = "hello there", **extra: Any) -> dict[str, Any]:
    return {"model": "sim-model", "max_tokens": 4, "messages": [{"role": "user", "content": content}], **extra}


def _schema(pattern: str) -> dict[str, Any]:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"QQQ": {"type": "string", "pattern": pattern}}}}}}


def _fresh_pattern() -> str:
    """A quote-free pattern no test counted before (the counts are cached per tenant and pattern)."""
    return "^[a-z]{2,4}-" + uuid.uuid4().hex + "$"


class Gate:
    """Stands for :func:`gateway.pattern_states.pattern_states` in gateway/schema_patterns.py: waits for
    :attr:`release` (10 s at most, then raises), burns ``burn_s`` of its thread's CPU, then counts; records the
    threads it ran on."""

    def __init__(self, inner: Any, burn_s: float = 0.0) -> None:
        self.inner = inner
        self.burn_s = burn_s
        self.started = threading.Event()
        self.release = threading.Event()
        self.threads: list[threading.Thread] = []

    def __call__(self, pattern: str, cap: int) -> int:
        self.threads.append(threading.current_thread())
        self.started.set()
        if not self.release.wait(10):
            raise RuntimeError("never released: the count blocked the event loop")
        t0 = time.thread_time()
        while time.thread_time() - t0 < self.burn_s:
            pass
        return int(self.inner(pattern, cap))


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Gate:
    import gateway.schema_patterns as sp

    g = Gate(sp.pattern_states)
    monkeypatch.setattr(sp, "pattern_states", g)
    return g


async def test_a_pattern_count_runs_off_the_loop_while_another_tenant_is_served(stack: Any, gate: Gate) -> None:
    heavy = asyncio.ensure_future(stack.client.post(PATH, json=_chat(**_schema(_fresh_pattern())),
                                                    headers=stack.auth("tenant-b/app")))
    assert await wait_for(gate.started.is_set, timeout_s=10.0)
    small = await stack.client.post(PATH, json=_chat(), headers=stack.auth())
    assert small.status_code == 200, small.text  # served while the count is held
    ready = await stack.client.get("/readyz")
    assert ready.status_code == 200, ready.text  # the readiness probe too
    assert not heavy.done()
    gate.release.set()
    r = await heavy
    assert r.status_code == 200, r.text
    assert gate.threads and all(t is not threading.main_thread() for t in gate.threads)


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    return {"limits": {"refused_cpu_ms_per_s": 1, "refused_cpu_burst_ms": 50}}


async def test_the_threads_cpu_is_charged_and_the_refusal_is_the_same(stack: Any, gate: Gate) -> None:
    """A schema refused 400 ``json_schema_too_complex`` (its pattern over ``max_pattern_states``) after its count
    burnt 80 ms of the worker thread's CPU: the same answer as on the loop, and tenant-a's budget (burst 50 ms here)
    is in debt, so its next plain request is refused 429 ``cpu_budget_exhausted``, and so is its next heavy one,
    whose pattern is never counted."""
    gate.burn_s, gate.release = 0.08, threading.Event()
    gate.release.set()
    hostile = "(?:a|a)" + uuid.uuid4().hex + "".join(chr(0x100 + 2 * i) for i in range(490)) + '[^"]{15000}'  # refused (S30-review30-1)
    r = await stack.client.post(PATH, json=_chat(**_schema(hostile)), headers=stack.auth())
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "json_schema_too_complex" and "max_pattern_states" in err["message"]
    assert gate.threads and all(t is not threading.main_thread() for t in gate.threads)
    counted = len(gate.threads)
    nxt = await stack.client.post(PATH, json=_chat(), headers=stack.auth())
    assert nxt.status_code == 429 and nxt.json()["error"]["code"] == "cpu_budget_exhausted", nxt.text
    again = await stack.client.post(PATH, json=_chat(**_schema(_fresh_pattern())), headers=stack.auth())
    assert again.status_code == 429 and again.json()["error"]["code"] == "cpu_budget_exhausted", again.text
    assert len(gate.threads) == counted  # refused before its count


def _bodies() -> dict[str, bytes]:
    """Raw bodies (compact JSON, ``ensure_ascii`` as given) and their names."""
    def raw(doc: dict[str, Any], ascii_only: bool = True) -> bytes:
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=ascii_only).encode()

    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"type": "string", "pattern": "^[a-z]+$"}}}}}
    plain_tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"type": "string"}}}}}
    escaped = raw(_chat(tools=[tool])).replace(b'"pattern"', b'"p\\u0061ttern"')  # decodes to "pattern"
    return {"plain": raw(_chat()), "plain non-ASCII escaped": raw(_chat("caf\u00e9 \u4e2d\u6587")),
            "plain non-ASCII": raw(_chat("caf\u00e9 \u4e2d\u6587"), False),
            "tools with a pattern": raw(_chat(tools=[tool])), "pattern key escaped": escaped,
            "tools without a pattern": raw(_chat(tools=[plain_tool])),
            "big tools without a pattern": raw(_chat("word " * 4000, tools=[plain_tool])),
            "big response_format without a pattern": raw(_chat("word " * 4000, response_format={"type": "json_object"})),
            "response_format": raw(_chat(**_schema("^[a-z]+$"))), "long prompt": raw(_chat("word " * 4000))}


def test_the_rule_picks_heavy_bodies_only() -> None:
    from gateway.prep_thread import SCHEMA_BODY_BYTES, PrepThread

    rule = PrepThread().prepares_off_loop
    picked = {name for name, body in _bodies().items() if rule(body)}
    assert picked == {"tools with a pattern", "pattern key escaped", "response_format", "big tools without a pattern",
                      "big response_format without a pattern"}  # S31-lead-4: big schema bodies too
    assert not rule(b'{"x":"' + b"y" * 100_000 + b'"}') and rule(b'{"pattern":1}')
    small = b'{"tools":[],"x":"' + b"y" * (SCHEMA_BODY_BYTES - 19) + b'"}'
    assert len(small) == SCHEMA_BODY_BYTES and not rule(small) and rule(small + b" ")


@pytest.fixture
def parsed_on(monkeypatch: pytest.MonkeyPatch) -> list[threading.Thread]:
    """The threads gateway/pipeline.py's front step ran on, in order."""
    import gateway.pipeline as pipeline

    threads: list[threading.Thread] = []
    inner = pipeline.parse_and_count

    def recorded(*args: Any) -> Any:
        threads.append(threading.current_thread())
        return inner(*args)

    monkeypatch.setattr(pipeline, "parse_and_count", recorded)
    return threads


async def test_the_pipeline_applies_the_rule(stack: Any, parsed_on: list[threading.Thread]) -> None:
    """The pipeline's inline test (no call on the plain path) and :meth:`PrepThread.prepares_off_loop` agree: each
    body is parsed on the worker thread exactly when the rule picks it, and answered the same (200, the
    ``tools`` body's escaped key read as ``tools``)."""
    rule = stack.components.prep_thread.prepares_off_loop
    for name, body in _bodies().items():
        r = await stack.client.post(PATH, content=body, headers={**JSON, **stack.auth("tenant-b/app")})
        assert r.status_code == 200, (name, r.text)
        assert (parsed_on[-1] is not threading.main_thread()) == rule(body), name
    bad = b'{"model":"sim-model","pattern":1,"messages":[' + b"x" * 200 + b"]}"  # off the loop, answered the same
    r = await stack.client.post(PATH, content=bad, headers={**JSON, **stack.auth("tenant-b/app")})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json", r.text
    assert parsed_on[-1] is not threading.main_thread()


async def test_heavy_requests_share_one_worker_thread(stack: Any, parsed_on: list[threading.Thread]) -> None:
    """Concurrent heavy bodies of two tenants: one thread prepares them all (no thread per request)."""
    tenants = ["tenant-a/app", "tenant-b/app"] * 4
    answers = await asyncio.gather(*(stack.client.post(PATH, json=_chat(**_schema(_fresh_pattern())),
                                                       headers=stack.auth(w)) for w in tenants))
    assert [r.status_code for r in answers] == [200] * len(tenants), [r.text for r in answers]
    assert len(parsed_on) == len(tenants) and len(set(parsed_on)) == 1
    assert parsed_on[0] is not threading.main_thread()


async def test_a_step_cancelled_while_queued_never_runs() -> None:
    """Tenant b's step waits in the thread's queue behind tenant a's running one; b's request is cancelled (its
    client left): when a's step ends, b's never starts."""
    from gateway.prep_thread import PrepThread
    from tests.gateway.test_s12_tokenize_off_loop import _Meter

    thread = PrepThread()
    ran: list[str] = []
    a_started, release_a = threading.Event(), threading.Event()

    def step(name: str) -> str:
        if name == "a":
            a_started.set()
            release_a.wait(10)
        ran.append(name)
        return name

    a_task = asyncio.ensure_future(thread.run(_Meter("a"), step, "a"))
    assert await wait_for(a_started.is_set, timeout_s=10.0)
    b_meter = _Meter("b")
    b_task = asyncio.ensure_future(thread.run(b_meter, step, "b"))
    assert await wait_for(lambda: len(b_meter.checks) == 1, timeout_s=10.0)  # submitted: b's step is queued
    b_task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await b_task
    release_a.set()
    assert await a_task == "a"
    c_task = asyncio.ensure_future(thread.run(_Meter("c"), step, "c"))  # the thread's queue is in order
    assert await c_task == "c"
    assert ran == ["a", "c"]
    await thread.stop()


async def test_a_step_runs_at_the_lower_switch_interval_and_puts_the_previous_one_back() -> None:
    """While a step runs on the thread the loop waits at most ``SWITCH_INTERVAL_S`` for the GIL (CPython's 5 ms would
    make each of the loop's wake-ups wait up to 5 ms while a heavy body is prepared); when the step ends or raises,
    the previous interval is back (the plain path runs at the interpreter's: S31-lead-3), and an interval already
    lower is left alone."""
    import sys

    from gateway.prep_thread import SWITCH_INTERVAL_S, PrepThread
    from tests.gateway.test_s12_tokenize_off_loop import _Meter

    before = sys.getswitchinterval()
    assert SWITCH_INTERVAL_S is not None
    thread = PrepThread()
    try:
        sys.setswitchinterval(0.005)
        await thread.start()
        assert sys.getswitchinterval() == pytest.approx(0.005)  # idle: the interpreter's
        assert await thread.run(_Meter("a"), sys.getswitchinterval) == pytest.approx(SWITCH_INTERVAL_S)
        assert sys.getswitchinterval() == pytest.approx(0.005)

        def fails() -> None:
            raise ValueError("QQQ")

        with pytest.raises(ValueError):
            await thread.run(_Meter("a"), fails)
        assert sys.getswitchinterval() == pytest.approx(0.005)
        sys.setswitchinterval(SWITCH_INTERVAL_S / 2)
        assert await thread.run(_Meter("a"), sys.getswitchinterval) == pytest.approx(SWITCH_INTERVAL_S / 2)
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S / 2)
    finally:
        await thread.stop()
        sys.setswitchinterval(before)
