"""Session 24 (finding S23-azure-2): admitted requests' pipelines start a few per event-loop iteration, in
arrival order (gateway/pipeline_turns.py, ``flow.pipeline_turns``).

Deterministic: the loop is "held" by starting every request before any runs; loop iterations are counted
by a callback that re-queues itself (a running stream's relay: one event per iteration). No sleeps.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from gateway.config_flow import FlowConfig
from gateway.pipeline_turns import MAX_WAIT_ITERATIONS, PipelineTurns
from tests.conftest import Stack


class LoopSteps:
    """Counts loop iterations (``relayed``): a callback re-queued each time it runs."""

    def __init__(self) -> None:
        self.relayed = 0
        self.stopped = False
        asyncio.get_running_loop().call_soon(self._step)

    def _step(self) -> None:
        if not self.stopped:
            self.relayed += 1
            asyncio.get_running_loop().call_soon(self._step)


async def _pipeline(turns: PipelineTurns | None, tenant: str, name: str, done: list[tuple[str, int]],
                    steps: LoopSteps) -> None:
    """A request's pipeline after admission: its turn, then its CPU work and send in one step (noted)."""
    if turns is not None and (turn := turns.enter(tenant)) is not None:
        await turn
    done.append((name, steps.relayed))


async def _run(turns: PipelineTurns | None, arrivals: list[tuple[str, str]]) -> list[tuple[str, int]]:
    steps, done = LoopSteps(), []
    await asyncio.gather(*[asyncio.ensure_future(_pipeline(turns, t, n, done, steps)) for t, n in arrivals])
    steps.stopped = True
    return done


def _per_iteration(done: list[tuple[str, int]]) -> list[int]:
    counts: dict[int, int] = {}
    for _, step in done:
        counts[step] = counts.get(step, 0) + 1
    return [counts[s] for s in sorted(counts)]


async def test_a_held_loop_starts_its_backlog_in_arrival_order_a_few_per_iteration() -> None:
    arrivals = [("t", f"r{i}") for i in range(12)]
    assert _per_iteration(await _run(None, arrivals)) == [12]  # without: all back to back, no relay between
    turns = PipelineTurns(2)
    done = await _run(turns, arrivals)
    assert [n for n, _ in done] == [f"r{i}" for i in range(12)]  # FIFO
    assert max(_per_iteration(done)) <= 3 and len(_per_iteration(done)) >= 4  # the relay runs in between
    assert turns.waiting == 0


async def test_the_wait_is_bounded_when_arrivals_outpace_the_turns() -> None:
    """Work-conserving: at least 1/MAX_WAIT_ITERATIONS of the waiters go each iteration, so a burst of 100
    with 1 turn per iteration is through in a few dozen iterations, not 100."""
    done = await _run(PipelineTurns(1), [("t", f"r{i}") for i in range(100)])
    assert [n for n, _ in done] == [f"r{i}" for i in range(100)]
    assert len(_per_iteration(done)) <= 100 // MAX_WAIT_ITERATIONS + 8


async def test_running_streams_keep_their_turn_while_arrivals_keep_coming() -> None:
    turns, steps, done = PipelineTurns(2), LoopSteps(), []
    tasks: list[asyncio.Task[None]] = []
    for wave in range(10):  # a wave of 5 requests arrives in each iteration
        tasks += [asyncio.ensure_future(_pipeline(turns, "t", f"w{wave}r{i}", done, steps)) for i in range(5)]
        before = steps.relayed
        await asyncio.sleep(0)
        assert steps.relayed > before or wave == 0  # the relay ran in this iteration too
    await asyncio.gather(*tasks)
    steps.stopped = True
    assert [n for n, _ in done] == [f"w{w}r{i}" for w in range(10) for i in range(5)]  # FIFO across waves


async def test_one_tenants_burst_does_not_hold_back_other_tenants() -> None:
    """FIFO per tenant, tenants in turn: b's and c's requests, arriving after a's burst of 8, go next."""
    arrivals = [("a", f"a{i}") for i in range(8)] + [("b", "b0"), ("c", "c0")]
    names = [n for n, _ in await _run(PipelineTurns(1), arrivals)]
    assert names[:4] == ["a0", "a1", "b0", "c0"]  # a0 went at once; a1 waited first; then b, then c
    assert [n for n in names if n.startswith("a")] == [f"a{i}" for i in range(8)]


async def test_a_cancelled_waiter_frees_its_place() -> None:
    """A waiter cancelled while it waits leaves nothing behind (removed from its tenant's queue, or, when its
    turn had just come, that one turn only); the requests after it go, in order."""
    turns = PipelineTurns(1)
    assert turns.enter("t") is None
    cancelled = turns.enter("t")
    assert cancelled is not None
    waiter = asyncio.ensure_future(cancelled)
    steps, done = LoopSteps(), []
    await asyncio.sleep(0)  # registered
    waiter.cancel()
    others = [asyncio.ensure_future(_pipeline(turns, "t", f"r{i}", done, steps)) for i in range(3)]
    await asyncio.gather(waiter, return_exceptions=True)
    await asyncio.gather(*others)
    steps.stopped = True
    assert waiter.cancelled() and [n for n, _ in done] == ["r0", "r1", "r2"]
    assert turns.waiting == 0


def test_bad_values_are_refused_and_the_default_is_off() -> None:
    with pytest.raises(ValueError):
        PipelineTurns(0)
    with pytest.raises(ValueError):
        FlowConfig(pipeline_turns=0)
    assert FlowConfig().pipeline_turns is None


@pytest.mark.parametrize("config_overrides", [{"flow": {"shed_loop_lag_s": None, "pipeline_turns": 1}}])
async def test_the_gateway_serves_concurrent_and_refused_requests_with_one_turn_per_iteration(stack: Stack) -> None:
    turns = stack.components.overload.turns
    assert turns is not None and turns.per_iteration == 1
    body = {"model": "sim-model", "prompt": "one two three four", "max_tokens": 2}
    bad = {"model": "no-such-model", "prompt": "x", "max_tokens": 2}  # refused after its turn (404)
    stream = {**body, "stream": True}
    calls = [stack.client.post("/v1/completions", headers=stack.auth(), json=b) for b in
             [body, bad, stream, body, bad, stream, body]]
    answers: list[httpx.Response] = await asyncio.gather(*calls)
    assert [r.status_code for r in answers] == [200, 404, 200, 200, 404, 200, 200]
    assert turns.waiting == 0
