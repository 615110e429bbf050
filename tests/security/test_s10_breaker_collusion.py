"""Session 10 lows, S9-L4: colluding tenants corroborated each other's failures and opened a replica's
shared circuit for every tenant.

Since R8-2 a gateway failure counts against a replica's shared circuit only when another tenant's
failure there corroborates it. Two tenants one attacker controls each sent input that made the
replica answer 503 and so opened the shared circuits of every replica: a third tenant got 503
``no_replica``. Now, before tenants' evidence alone opens a shared circuit, the gateway sends one
completion of its own (model ``sim-model``, prompt ``ping``, one token, no tenant) and opens only
if that fails too; otherwise the failures stay with the colluders' own (replica, tenant) circuits.
Verification probes are bounded: one in flight per replica, ``verify_interval_s`` apart.

End to end on fake replicas (aiohttp, here): 503 to a prompt holding ``POISON`` (or to every
completion while ``fail_all``), a normal answer otherwise; ``probes`` counts the gateway's own
requests and ``hold_probes`` keeps them unanswered. Unit cases on a fake clock and a fake verifier.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from gateway.health import PROBE_PROMPT, completion_probe
from gateway.replica_verify import Gate, VerifyGate
from gateway.replicas import CircuitState, Replica, ReplicaSet
from tests.support.fake_replicas import (  # noqa: F401 - n_replicas: this module's stack fixture
    PLAIN_ANSWER, base_app, completion, n_replicas, serving)
from tests.support.waiting import wait_for

TD = "demo.prefixgate.test"
COOLDOWN_S = 1.5


@dataclass
class Fake:
    """One fake replica's switches and counters."""

    url: str = ""
    healthy: bool = True
    fail_all: bool = False
    poison_hits: int = 0
    ok: int = 0
    probes: list[dict[str, Any]] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight: int = 0
    hold_probes: asyncio.Event = field(default_factory=asyncio.Event)


def _app(fake: Fake) -> web.Application:
    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = str(body.get("prompt", ""))
        if prompt == PROBE_PROMPT:
            fake.probes.append(body)
            fake.in_flight += 1
            fake.most_in_flight = max(fake.most_in_flight, fake.in_flight)
            try:
                await fake.hold_probes.wait()
            finally:
                fake.in_flight -= 1
        if fake.fail_all or "POISON" in prompt:
            fake.poison_hits += "POISON" in prompt
            return web.json_response({"error": {"message": "overloaded by this input"}}, status=503)
        fake.ok += 1
        return web.json_response(PLAIN_ANSWER)

    return base_app(fake, completions)


@pytest.fixture
async def fakes() -> AsyncIterator[list[Fake]]:
    out = [Fake() for _ in range(2)]
    for f in out:
        f.hold_probes.set()
    async with serving(out, _app) as served:
        yield served
        for f in served:
            f.hold_probes.set()


def _tenant(name: str) -> dict[str, Any]:
    return {"id": name, "spiffe_ids": [f"spiffe://{TD}/{name}/"], "models": ["sim-model"], "pools": ["default"],
            "max_output_tokens": 256}


@pytest.fixture
def config_overrides(fakes: list[Fake], tmp_path: Any) -> dict[str, Any]:
    secret = tmp_path / "master.key"  # the stack writes it before the configuration is loaded
    return {
        "replicas": [{"id": "f0", "url": fakes[0].url, "pool": "default"},
                     {"id": "f1", "url": fakes[1].url, "pool": "default"}],
        "health": {"interval_s": 0.1, "timeout_s": 2.0, "unhealthy_after": 1, "healthy_after": 1,
                   "breaker_failures": 3, "breaker_cooldown_s": COOLDOWN_S},
        "tenancy": {"master_secret_file": str(secret), "master_secret_env": None,
                    "state_file": str(tmp_path / "keystate.json"), "operators": [f"spiffe://{TD}/ops/admin"],
                    "tenants": [_tenant("tenant-a"), _tenant("tenant-b"), _tenant("tenant-c")]},
    }


async def _post(stack: Any, tenant: str, prompt: str) -> int:
    r = await stack.client.post("/v1/completions", json=completion(prompt), headers=stack.auth(tenant))
    return int(r.status_code)


async def test_two_colluding_tenants_do_not_open_the_shared_circuits(stack: Any, fakes: list[Fake]) -> None:
    """tenant-a and tenant-b, one attacker, alternate poison on both replicas. Before the fix: both
    shared circuits OPEN, tenant-c 503 ``no_replica``. Now the gateway's own completion is served, so
    the shared circuits stay closed, the colluders' own pairs open, tenant-c is served."""
    rs = stack.components.replica_set
    await wait_for(lambda: rs.routable_ids() == ["f0", "f1"], what="fake replicas healthy")
    statuses = []
    for i in range(8):
        for tenant in ("tenant-a/app", "tenant-b/app"):
            statuses.append(await _post(stack, tenant, f"POISON {i}"))
            await wait_for(lambda: not any(rs.verify.in_flight(r) for r in ("f0", "f1")), what="probe verdicts")
    assert all(s in (502, 503) for s in statuses), statuses
    assert rs.state("f0").circuit is CircuitState.CLOSED and rs.state("f1").circuit is CircuitState.CLOSED
    assert rs.routable_ids() == ["f0", "f1"]
    for tenant in ("tenant-a", "tenant-b"):  # the failures stayed with the colluders
        assert rs.tenants.blocked("f0", tenant) and rs.tenants.blocked("f1", tenant), tenant
    assert statuses[-1] == 503  # answered without reaching a replica
    for i in range(4):
        assert await _post(stack, "tenant-c/app", f"hello {i}") == 200
    # the gateway asked each replica itself, at most once per interval, never with tenant data
    probes = fakes[0].probes + fakes[1].probes
    assert 1 <= len(fakes[0].probes) <= 2 and 1 <= len(fakes[1].probes) <= 2, probes
    assert all(p == {"model": "sim-model", "prompt": PROBE_PROMPT, "max_tokens": 1, "temperature": 0,
                     "stream": False} for p in probes), probes
    assert fakes[0].poison_hits + fakes[1].poison_hits <= 2 * (2 * 3 + 2)  # bounded engine work


async def test_a_real_fault_still_opens_the_shared_circuit(stack: Any, fakes: list[Fake]) -> None:
    """A replica failing every request: two tenants' failures there, then the gateway's own request
    fails too, and the shared circuit opens for every tenant; the other replica serves."""
    rs = stack.components.replica_set
    await wait_for(lambda: rs.routable_ids() == ["f0", "f1"], what="fake replicas healthy")
    fakes[0].fail_all = True
    for i in range(12):
        for tenant in ("tenant-a/app", "tenant-b/app"):
            assert await _post(stack, tenant, f"x {i}") == 200  # retried on f1
        if rs.state("f0").circuit is CircuitState.OPEN:
            break
        await wait_for(lambda: not rs.verify.in_flight("f0"), what="probe verdict")
    assert rs.state("f0").circuit is CircuitState.OPEN
    assert len(fakes[0].probes) == 1
    assert rs.state("f1").circuit is CircuitState.CLOSED
    assert await _post(stack, "tenant-c/app", "hello") == 200


async def test_a_real_fault_met_by_one_tenant_alone_opens_the_shared_circuit(stack: Any, fakes: list[Fake]) -> None:
    """Session 8/9 residual: a replica failing every request that ``/health`` does not see, used by one
    tenant alone, stayed in the shared rotation until a second tenant failed there. Now the opening of
    that tenant's pair makes the gateway send its own request, which fails too: the shared circuit
    opens, and another tenant is never sent there. Before: f0's shared circuit CLOSED."""
    rs = stack.components.replica_set
    await wait_for(lambda: rs.routable_ids() == ["f0", "f1"], what="fake replicas healthy")
    fakes[0].fail_all = True
    for i in range(8):
        assert await _post(stack, "tenant-a/app", f"a {i}") == 200  # retried on f1
    assert rs.tenants.blocked("f0", "tenant-a")
    await wait_for(lambda: rs.state("f0").circuit is CircuitState.OPEN, what="f0's shared circuit open")
    assert len(fakes[0].probes) == 1
    ok_f0 = fakes[0].ok
    for i in range(4):
        assert await _post(stack, "tenant-c/app", f"c {i}") == 200
    assert fakes[0].ok == ok_f0 and rs.state("f1").circuit is CircuitState.CLOSED


async def test_one_probe_in_flight_per_replica_whatever_the_tenants_do(stack: Any, fakes: list[Fake]) -> None:
    """The gateway's probe held unanswered while the colluders keep failing: still one probe per
    replica; the circuit stays closed meanwhile (failures retried elsewhere) and follows its verdict."""
    rs = stack.components.replica_set
    await wait_for(lambda: rs.routable_ids() == ["f0", "f1"], what="fake replicas healthy")
    fakes[1].healthy = False  # one replica: every poison lands on f0
    await wait_for(lambda: rs.routable_ids() == ["f0"], what="only f0 routable")
    fakes[0].hold_probes.clear()
    for i in range(10):
        for tenant in ("tenant-a/app", "tenant-b/app"):
            await _post(stack, tenant, f"POISON {i}")
    assert len(fakes[0].probes) == 1 and fakes[0].most_in_flight == 1
    assert rs.verify.in_flight("f0") and rs.state("f0").circuit is CircuitState.CLOSED
    fakes[0].hold_probes.set()
    await wait_for(lambda: not rs.verify.in_flight("f0"), what="probe verdict")
    assert rs.state("f0").circuit is CircuitState.CLOSED and rs.state("f0").consecutive_failures == 0
    assert await _post(stack, "tenant-c/app", "hello") == 200


# ----------------------------------------------------------------------------- unit: the rule


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _set(clock: Clock, answers: list[bool] | None = None) -> tuple[ReplicaSet, list[str]]:
    """A replica set r0 (threshold 3, cool-down 5 s, verification interval 5 s) whose verifier
    records each call and starts a probe (``answers``: what each call returns; default True)."""
    rs = ReplicaSet([Replica("r0", "http://r0")], failure_threshold=3, cooldown_s=5.0, clock=clock)
    calls: list[str] = []
    queue = list(answers or [])

    def verifier(rid: str) -> bool:
        calls.append(rid)
        return queue.pop(0) if queue else True

    rs.verifier = verifier
    return rs, calls


def _collude(rs: ReplicaSet, n: int) -> None:
    for i in range(n):
        rs.attempt("r0", ("a", "b")[i % 2]).failed()


def test_tenant_evidence_waits_for_the_gateways_probe() -> None:
    clock = Clock()
    rs, calls = _set(clock)
    _collude(rs, 4)  # a (attributed), b, a, b (corroborated: 3 -> would open)
    assert calls == ["r0"] and rs.state("r0").circuit is CircuitState.CLOSED
    _collude(rs, 10)  # held: still one probe
    assert calls == ["r0"] and rs.verify.in_flight("r0") and rs.is_routable("r0")
    rs.verified("r0", True)
    st = rs.state("r0")
    assert st.circuit is CircuitState.CLOSED and st.consecutive_failures == 0
    _collude(rs, 10)  # within the interval: the tenants' own, no probe
    assert calls == ["r0"] and rs.state("r0").consecutive_failures == 0
    assert rs.tenants.blocked("r0", "a") and rs.tenants.blocked("r0", "b")
    clock.t += 5.0  # the interval has passed: the next would-open failure asks again
    _collude(rs, 6)
    assert calls == ["r0", "r0"]


def test_a_pair_opening_asks_the_gateways_probe() -> None:
    """One tenant alone: its pair opens at the threshold and the gateway verifies; a failed verdict
    opens the shared circuit, a passed one leaves it closed (the failures were the tenant's)."""
    for ok, expected in ((False, CircuitState.OPEN), (True, CircuitState.CLOSED)):
        clock = Clock()
        rs, calls = _set(clock)
        for _ in range(3):
            rs.attempt("r0", "a").failed()
        assert rs.tenants.blocked("r0", "a") and calls == ["r0"]
        assert rs.state("r0").circuit is CircuitState.CLOSED
        rs.verified("r0", ok)
        assert rs.state("r0").circuit is expected and rs.tenants.blocked("r0", "a")
        for t in ("b", "c", "d"):  # more pairs opening within the interval: no further probe
            for _ in range(3):
                rs.attempt("r0", t).failed()
        assert calls == ["r0"]


def test_a_failed_probe_opens_and_stands_for_the_interval() -> None:
    clock = Clock()
    rs, calls = _set(clock)
    _collude(rs, 4)
    rs.verified("r0", False)
    assert rs.state("r0").circuit is CircuitState.OPEN and not rs.is_routable("r0")
    clock.t += 5.0  # cool-down over: half-open; the failed verdict stood until now (5 s after it)
    assert rs.state("r0").circuit is CircuitState.HALF_OPEN
    probe = rs.attempt("r0", "a")
    assert probe.probe
    probe.failed()  # the half-open probe fails, corroborated by b: a new verification, not a re-open
    assert rs.state("r0").circuit is CircuitState.HALF_OPEN
    assert calls == ["r0", "r0"] and not rs.is_routable("r0")  # the probe slot is kept for the verdict
    rs.verified("r0", True)
    assert rs.state("r0").circuit is CircuitState.CLOSED and rs.is_routable("r0")


def test_a_half_open_failure_within_the_interval_of_a_failed_probe_reopens_at_once() -> None:
    clock = Clock()
    rs, calls = _set(clock)
    rs.cooldown_s = 1.0  # shorter than the verification interval (5 s)
    _collude(rs, 4)
    rs.verified("r0", False)
    clock.t += 1.0
    assert rs.is_routable("r0")  # half-open
    probe = rs.attempt("r0", "a")
    assert probe.probe
    probe.failed()
    assert rs.state("r0").circuit is CircuitState.OPEN and calls == ["r0"]


def test_independent_evidence_needs_no_probe() -> None:
    clock = Clock()
    rs, calls = _set(clock)
    for _ in range(3):
        rs.attempt("r0", "a").failed(reached=False)  # nothing sent: no tenant's doing
    assert rs.state("r0").circuit is CircuitState.OPEN and calls == []
    rs2, calls2 = _set(clock)
    for _ in range(3):
        rs2.attempt("r0", None).failed()
    assert rs2.state("r0").circuit is CircuitState.OPEN and calls2 == []


def test_no_probe_can_be_sent_counts_as_before() -> None:
    clock = Clock()
    rs, calls = _set(clock, answers=[False])
    _collude(rs, 4)
    assert calls == ["r0"] and rs.state("r0").circuit is CircuitState.OPEN and not rs.verify.in_flight("r0")


def test_the_gate() -> None:
    clock = Clock()
    gate = VerifyGate(2.0, clock)
    assert gate.decide("r") is Gate.START
    gate.began("r")
    assert gate.decide("r") is Gate.HOLD and gate.in_flight("r") and not gate.vouched("r")
    clock.t += 10  # a slow probe: the interval counts from its end
    gate.ended("r", True)
    assert gate.decide("r") is Gate.PASSED and gate.vouched("r")
    clock.t += 1.9
    assert gate.decide("r") is Gate.PASSED
    clock.t += 0.1
    assert gate.decide("r") is Gate.START and not gate.vouched("r")
    gate.began("r")
    gate.ended("r", False)
    assert gate.decide("r") is Gate.FAILED
    gate.forget("r")
    gate.ended("r", True)  # forgotten: nothing to end
    assert gate.decide("r") is Gate.START and gate.started == 2
    with pytest.raises(ValueError):
        VerifyGate(0)


# ------------------------------------------------------------------------ unit: the probe itself


@contextlib.asynccontextmanager
async def _probed(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> AsyncIterator[tuple[Any, str]]:
    """A replica whose ``POST /v1/completions`` is ``handler``: ``(aiohttp session, its url)`` to probe it."""
    import aiohttp

    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    fake = Fake()
    async with serving([fake], lambda _f: app):
        async with aiohttp.ClientSession() as session:
            yield session, fake.url


@pytest.mark.parametrize(("status", "body", "expected"), [
    (200, PLAIN_ANSWER, True),
    (503, {"error": {}}, False),
    (200, {"no": "choices"}, False),
    (200, "not json", False),
    (404, PLAIN_ANSWER, False),
])
async def test_completion_probe(status: int, body: Any, expected: bool) -> None:
    seen: list[Any] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(await request.json())
        if isinstance(body, str):
            return web.Response(text=body, status=status)
        return web.json_response(body, status=status)

    async with _probed(handler) as (session, url):
        assert await completion_probe(session, url, "m", 2.0) is expected
    assert seen == [{"model": "m", "prompt": PROBE_PROMPT, "max_tokens": 1, "temperature": 0, "stream": False}]


async def test_completion_probe_is_bounded_by_its_timeout() -> None:
    release = asyncio.Event()

    async def handler(request: web.Request) -> web.Response:
        await release.wait()
        return web.json_response(PLAIN_ANSWER)

    async with _probed(handler) as (session, url):
        assert await completion_probe(session, url, "m", 0.2) is False
        release.set()


async def test_completion_probe_reads_a_bounded_answer() -> None:
    from gateway.health import PROBE_MAX_BYTES

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        for _ in range(PROBE_MAX_BYTES // 65536 + 2):
            await resp.write(b" " * 65536)
        await resp.write_eof()
        return resp

    async with _probed(handler) as (session, url):
        assert await completion_probe(session, url, "m", 5.0) is False
