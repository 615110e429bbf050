"""Heavy request bodies prepared on the worker thread, off the event loop (session 31, offload31; S30-review30-3,
S30-attack30-6).

The request's front (:func:`gateway.admission_front.parse_and_count`: parse, the JSON-schema bounds of
``response_format`` and ``tools`` with their ``pattern`` counts, schema validation, the rendering of the fields
that become prompt tokens, the entitlement, the prompt-token room and the prompt's tokens) runs synchronously. On
the event loop, every other tenant's requests and the readiness probe waited for it: 1.4-3 ms for the most
expensive bodies the default limits admit (a 300-property schema, 32 tools, 800 messages, a 7,000-word prompt:
~3-5 ms of gateway CPU per request in all), ~90-130 ms for a schema whose quote-free ``pattern`` s are counted up to
``limits.json_schema.max_pattern_states`` (refused).

A body :meth:`PrepThread.prepares_off_loop` picks is prepared by the same step on the gateway's one worker thread
(:class:`PrepThread`, a :class:`gateway.tokenize_thread.TokenizeThread`, shared with the ``hf:`` tokenizer's long
prompts): its thread CPU is added to the request's :class:`gateway.cpu_budget.CpuMeter` (the tenant pays for it as
for an inline step; 429 ``cpu_budget_exhausted`` is checked before the step), its errors are re-raised on the loop
(the same HTTP answers), each tenant has at most one step on the thread (queued or running: its next waits on the
loop, for free, and the thread serves the tenants in turn), a step whose request is cancelled while it waits in the
thread's queue never runs, and one already running is charged when it ends.

The worker still holds the GIL while it runs Python code; CPython makes it give the GIL to a waiting thread (the
loop's, woken by a request, an answer or a timer) after ``sys.getswitchinterval()`` of waiting, so while a heavy
body is prepared the loop runs its callbacks between slices instead of waiting for the whole preparation. CPython's
default interval, 5 ms, is as long as the heavy preparations themselves (each of the loop's wake-ups may wait that
long while the thread is busy), so each step lowers it to :data:`SWITCH_INTERVAL_S` (0.5 ms) while it runs and puts
the previous one back when it ends (S31-lead-3: offload31 lowered it for the gateway's whole life; the process runs at
the interpreter's interval whenever the thread is idle, as on the plain path). C calls that hold the GIL (the JSON decoder, schema validation, the word tokenizer's splits) are
not cut: each is one slice (docs/benchmarks.md "Session 31: offload31").

Which bodies (the pipeline tests the same rule inline, with operators only, so the plain path makes no extra call):
a body that may hold a ``pattern`` key, the one whose count (``max_pattern_states``) can hold the loop for ~100 ms:
the key spelt as is, or an escaped ASCII letter or ``_`` anywhere (``\\u005.``, ``\\u006.``, ``\\u007.``: a key
written ``"p\\u0061ttern"`` decodes to ``pattern``; no JSON encoder writes those escapes, so ordinary non-ASCII text,
escaped as ``\\u00e9`` or ``\\u4e2d``, stays on the loop). Session 31's lead narrowed offload31's rule (which also
sent every body longer than 16 KiB and every ``tools`` or ``response_format`` body) to this (S31-lead-2): a thread
hop costs ~45 µs of wall time and ~30 µs of the loop's CPU, and while the worker holds the GIL the loop's other
requests take turns with it (offload31 measured another tenant's p50 up 0.1-0.7 ms beside 1.5-3 ms bodies, p99
down): long prompts and small tool-using bodies, common in real workloads, keep their single-threaded path. Since
review31b measured bodies without a pattern that still cost the loop 9-193 ms at the default limits (a 76 KB tools
body whose ``$ref`` s resolve in every enclosing root: S31-review31b-2, -6), a body longer than
:data:`SCHEMA_BODY_BYTES` that may hold ``tools`` or ``response_format`` goes to the thread as well (S31-lead-4); a
long prompt without them stays on the loop.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway.tokenize_thread import TokenizeThread

if TYPE_CHECKING:
    from gateway.cpu_budget import CpuMeter

__all__ = ["SCHEMA_BODY_BYTES", "SWITCH_INTERVAL_S", "PrepThread"]

#: the interpreter's GIL switch interval (seconds) while a step runs on the thread, when lower than the interpreter's
#: (CPython's default 5 ms): the most a thread waiting for the GIL (the loop's) waits before the holder gives it up
SWITCH_INTERVAL_S: float | None = 0.0005
#: a body longer than this many bytes with a ``tools`` or ``response_format`` key is prepared on the thread too: its
#: schema walk and ``$ref`` resolution can cost the loop tens to hundreds of ms (S31-review31b-2, -6; S31-lead-4)
SCHEMA_BODY_BYTES = 16_384


class PrepThread(TokenizeThread):
    """The gateway's one worker thread (:class:`TokenizeThread`: steps metered into the request's ``CpuMeter``, one
    step per tenant on it, :meth:`stop` ends it), which also prepares the bodies :meth:`prepares_off_loop` picks.
    ``switch_interval_s``: the GIL switch interval while one of its steps runs (None: the interpreter's)."""

    def __init__(self, switch_interval_s: float | None = SWITCH_INTERVAL_S) -> None:
        super().__init__()
        self.switch_interval_s = switch_interval_s

    async def run(self, meter: CpuMeter, fn: Callable[..., Any], *args: Any) -> Any:
        """:meth:`TokenizeThread.run` with the interpreter's switch interval lowered to ``switch_interval_s`` while
        the step runs on the thread (set and put back by the thread itself, around ``fn``; the thread runs one step
        at a time): a plain request, served while the thread is idle, runs at the interpreter's interval (S31-lead-3).
        Returns what ``fn`` returns; raises what :meth:`TokenizeThread.run` raises."""
        if self.switch_interval_s is None:
            return await super().run(meter, fn, *args)
        return await super().run(meter, _lowered, self.switch_interval_s, fn, args)

    def prepares_off_loop(self, raw: bytes) -> bool:
        """True when the body ``raw`` (the request's bytes) is prepared on this thread (the module docstring's rule;
        gateway/pipeline.py tests the same expression inline). Raises nothing."""
        return (b'"pattern"' in raw or b"\\u00" in raw and self.escaped(raw)
                or bool(raw[SCHEMA_BODY_BYTES:]) and (b'"tools"' in raw or b'"response_format"' in raw))

    @staticmethod
    def escaped(raw: bytes) -> bool:
        """True when ``raw`` holds an escaped ASCII letter or ``_`` (``\\u005.``, ``\\u006.``, ``\\u007.``): a key
        may then be ``pattern`` spelt otherwise."""
        return b"\\u005" in raw or b"\\u006" in raw or b"\\u007" in raw


def _lowered(interval_s: float, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """``fn(*args)`` with the interpreter's GIL switch interval at most ``interval_s`` seconds, the previous one put
    back when ``fn`` returns or raises (run on the worker thread). Returns what ``fn`` returns; re-raises its error."""
    previous = sys.getswitchinterval()
    if interval_s >= previous:
        return fn(*args)
    sys.setswitchinterval(interval_s)
    try:
        return fn(*args)
    finally:
        sys.setswitchinterval(previous)
