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

One thread: big prompts take turns (a second core at most, never the loop's), so one tenant's
concurrent big prompts can delay another tenant's big prompt, bounded by its concurrency and
its CPU budget; small prompts never wait for them. The step's CPU is the worker thread's
(``time.thread_time`` there) and is added to the request's :class:`gateway.cpu_budget.CpuMeter`
like an inline step; a request whose client leaves while its step runs is charged the step's
CPU when it ends (the thread cannot be interrupted).
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

    async def run(self, meter: CpuMeter, fn: Callable[..., Any], *args: Any) -> Any:
        """Return ``fn(*args)`` run on the worker thread, its thread CPU added to ``meter``
        (charged to the tenant at once when the request was cancelled meanwhile); re-raises
        what ``fn`` raised. First raises 429 ``cpu_budget_exhausted`` when ``meter``'s tenant
        is in debt (:meth:`CpuMeter.check_step`)."""
        clock = meter.check_step()
        fut = asyncio.get_running_loop().run_in_executor(self._pool, _timed, clock, fn, args)
        try:
            cpu_s, out, exc = await asyncio.shield(fut)
        except asyncio.CancelledError:
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
        """Stop the worker thread once its queued steps are done (idempotent)."""
        self._pool.shutdown(wait=False)
