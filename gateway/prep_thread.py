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
long while the thread is busy), so the started thread lowers it to :data:`SWITCH_INTERVAL_S` (0.5 ms; it only
matters while two threads want the GIL: the plain path, one thread, is unchanged; :meth:`PrepThread.stop` puts the
previous one back). C calls that hold the GIL (the JSON decoder, schema validation, the word tokenizer's splits) are
not cut: each is one slice (docs/benchmarks.md "Session 31: offload31").

Which bodies (the pipeline tests the same rule inline, with operators only, so the plain path makes no extra call):
longer than :data:`PREP_THREAD_BYTES` bytes (``prep_bytes``; a body that short costs ~1 ms of preparation at most
whatever it holds: 800 small messages, the costliest per byte measured, ~60 ns a byte), or any body that may hold a
top-level ``tools`` or ``response_format`` key (the two fields whose schemas are walked and whose patterns are
counted, whatever the body's size): the key spelt as is, or an escaped ASCII letter or ``_`` anywhere
(``\\u005.``, ``\\u006.``, ``\\u007.``: a key written ``"t\\u006fols"`` decodes to ``tools``; no JSON encoder
writes those escapes, so ordinary non-ASCII text, escaped as ``\\u00e9`` or ``\\u4e2d``, stays on the loop). A plain
body (small, no schema, no tools) is prepared on the loop as before: a thread hop (~45 µs of wall time, ~30 µs of
the loop's CPU) would only add latency.
"""

from __future__ import annotations

import sys

from gateway.tokenize_thread import TokenizeThread

__all__ = ["PREP_THREAD_BYTES", "SWITCH_INTERVAL_S", "PrepThread"]

#: bodies longer than this many bytes are prepared on the worker thread (:attr:`PrepThread.prep_bytes`)
PREP_THREAD_BYTES = 16_384
#: the interpreter's GIL switch interval (seconds) while the thread is started, when lower than the interpreter's
#: (CPython's default 5 ms): the most a thread waiting for the GIL (the loop's) waits before the holder gives it up
SWITCH_INTERVAL_S: float | None = 0.0005


class PrepThread(TokenizeThread):
    """The gateway's one worker thread (:class:`TokenizeThread`: steps metered into the request's ``CpuMeter``, one
    step per tenant on it, :meth:`stop` ends it), which also prepares heavy bodies. ``prep_bytes``: a longer body
    is prepared on it (:data:`PREP_THREAD_BYTES`)."""

    def __init__(self, prep_bytes: int = PREP_THREAD_BYTES, switch_interval_s: float | None = SWITCH_INTERVAL_S) -> None:
        super().__init__()
        self.prep_bytes = prep_bytes
        self.switch_interval_s = switch_interval_s
        self._restore: float | None = None  # the interval :meth:`start` replaced, put back by :meth:`stop`

    async def start(self) -> None:
        """Lower the interpreter's GIL switch interval to ``switch_interval_s`` (when lower; :meth:`stop` puts the
        previous one back): the thread starts with the first step."""
        now = sys.getswitchinterval()
        if self.switch_interval_s is not None and self.switch_interval_s < now and self._restore is None:
            self._restore = now
            sys.setswitchinterval(self.switch_interval_s)

    async def stop(self) -> None:
        """Stop the thread (:meth:`TokenizeThread.stop`) and put the switch interval back (idempotent)."""
        await super().stop()
        if self._restore is not None:
            sys.setswitchinterval(self._restore)
            self._restore = None

    def prepares_off_loop(self, raw: bytes) -> bool:
        """True when the body ``raw`` (the request's bytes) is prepared on this thread (the module docstring's rule;
        gateway/pipeline.py tests the same expression inline). Raises nothing."""
        return bool(raw[self.prep_bytes:] or b'"tools"' in raw or b'"response_format"' in raw or b"\\u00" in raw
                    and self.escaped(raw))

    @staticmethod
    def escaped(raw: bytes) -> bool:
        """True when ``raw`` holds an escaped ASCII letter or ``_`` (``\\u005.``, ``\\u006.``, ``\\u007.``): a key
        may then be ``tools`` or ``response_format`` spelt otherwise."""
        return b"\\u005" in raw or b"\\u006" in raw or b"\\u007" in raw
