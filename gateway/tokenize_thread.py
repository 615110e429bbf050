"""Large prompts tokenized on one worker thread, off the event loop (review R12-3, session 12).

With ``routing.tokenizer: hf:...`` an accepted 1 MiB prompt costs ~0.6 s of tokenizer CPU
(~1.4 µs per token on the CI machine), and before this change it ran on the event loop: every
tenant's requests waited for it. The ``tokenizers`` package releases the GIL in
``encode_batch`` (tenancy/hf_tokenizer.py uses it for long texts), so the prompt step
(:meth:`gateway.admission.Admission.prompt_tokens`) of a request whose prompts hold at least
:data:`tenancy.hf_tokenizer.GIL_FREE_CHARS` bytes runs on :class:`TokenizeThread` instead: the
loop serves other requests meanwhile. Shorter prompts, and tokenizers that hold the GIL
(the default ``word``, pure Python: bounded by its own early stop), stay inline, where a thread
hop would only add latency.

One thread: big prompts take turns (a second core at most, never the loop's); small prompts never
wait for them. Review R12b-1 (session 12): a tenant has at most one step on the thread (queued or
running); its next step waits on the event loop, for free, and re-checks the tenant's CPU budget
when its turn comes (429 ``cpu_budget_exhausted`` once the tenant is in debt). Before, one tenant
could queue a step for each of its requests in flight (up to 256 with flow control on, which
takes the concurrency slot after tokenizing) and another tenant's big prompt waited behind all of
them. Now a big prompt waits for at most one step of each other tenant. The step's CPU is the worker thread's
(``time.thread_time`` there) and is added to the request's :class:`gateway.cpu_budget.CpuMeter`
like an inline step; a request whose client leaves while its step runs is charged the step's
CPU when it ends (the thread cannot be interrupted); one cancelled while its step still waits in the thread's queue
(behind another tenant's) takes it out: the step never runs (session 31, offload31).

Session 31 (offload31): the same thread also prepares heavy request bodies (:mod:`gateway.prep_thread`), whatever
the tokenizer: the gateway has one such thread, with one step per tenant on it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import Any

from gateway.cpu_budget import CpuMeter
from gateway.request import InferenceRequest
from tenancy.hf_tokenizer import GIL_FREE_CHARS

__all__ = ["TokenizeThread", "tokenizes_off_loop"]


def tokenizes_off_loop(tokenizer: Any, req: InferenceRequest) -> bool:
    """True when ``req``'s prompt step should run on the tokenizer thread: ``tokenizer``
    releases the GIL for long texts (``releases_gil``) and the request's prompts hold at least
    :data:`tenancy.hf_tokenizer.GIL_FREE_CHARS` UTF-8 bytes in all."""
    return getattr(tokenizer, "releases_gil", False) and sum(req.prompt_bytes) >= GIL_FREE_CHARS


def _timed(cpu_clock: Callable[[], float], fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[float, Any, BaseException | None]:
    """On the worker thread: ``(thread CPU seconds, result, exception)`` of ``fn(*args)``."""
    c0 = cpu_clock()
    try:
        out = fn(*args)
    except BaseException as exc:  # handed back to the awaiting request
        return cpu_clock() - c0, None, exc
    return cpu_clock() - c0, out, None


class TokenizeThread:
    """One worker thread for prompt steps that release the GIL; :meth:`stop` ends it."""

    def __init__(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefixgate-tokenize")
        #: per tenant id: (its turn lock, steps waiting for or holding it); dropped at zero
        self._turns: dict[str | None, tuple[asyncio.Lock, int]] = {}

    async def run(self, meter: CpuMeter, fn: Callable[..., Any], *args: Any) -> Any:
        """Return ``fn(*args)`` run on the worker thread, its thread CPU added to ``meter``
        (charged to the tenant at once when the request was cancelled meanwhile); re-raises
        what ``fn`` raised. Waits for the tenant's previous step to end (one at a time per
        tenant), then raises 429 ``cpu_budget_exhausted`` when ``meter``'s tenant is in debt
        (:meth:`CpuMeter.check_step`)."""
        key = meter.tenant.id if meter.tenant is not None else None
        lock, users = self._turns.get(key) or (asyncio.Lock(), 0)
        self._turns[key] = (lock, users + 1)
        try:
            async with lock:
                return await self._step(meter, fn, args)
        finally:
            lock, users = self._turns[key]
            if users <= 1:
                del self._turns[key]
            else:
                self._turns[key] = (lock, users - 1)

    async def _step(self, meter: CpuMeter, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """One step on the thread, the tenant's turn held (see :meth:`run`)."""
        clock = meter.check_step(always=True)
        job = self._pool.submit(_timed, clock, fn, args)
        fut = asyncio.wrap_future(job)
        try:
            cpu_s, out, exc = await asyncio.shield(fut)
        except asyncio.CancelledError:
            if job.cancel():  # session 31: still queued behind another tenant's step: never runs, costs nothing
                raise
            fut.add_done_callback(lambda f: meter.add_off_loop(f.result()[0], late=True)
                                  if not f.cancelled() and f.exception() is None else None)
            raise
        meter.add_off_loop(cpu_s)
        if exc is not None:
            raise exc
        return out

    async def start(self) -> None:
        """Nothing to open: the thread starts with the first step (a :class:`gateway.build.Lifecycle`)."""

    async def stop(self) -> None:
        """Stop the worker thread: queued steps are cancelled (their requests get the cancellation),
        the running one ends (idempotent)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
