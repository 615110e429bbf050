"""A per-tenant budget of gateway CPU for refused requests (review R5-8).

Preparing a request (parsing its body, tokenizing its prompts, deriving its prefix keys)
runs on the event loop without yielding. An accepted request pays for that work in
prompt tokens (the tenant's token buckets); a refused one (``400
context_length_exceeded``, ``429 token_rate_limited``, a policy denial...) is charged
nothing there. Before this budget, one tenant looping refused 1 MiB requests (37-71 ms of
CPU each) queued enough work in front of the loop-lag probe to make the gateway shed
every tenant (``flow.shed_loop_lag_s``) and report not ready.

So each tenant has a token bucket (:class:`tenancy.limits.TokenBucket`, the one the
request-rate limits use) of CPU-seconds: it refills at ``limits.refused_cpu_ms_per_s``
and holds at most ``limits.refused_cpu_burst_ms`` (per-tenant overrides:
``tenants[].refused_cpu_ms_per_s`` / ``refused_cpu_burst_ms``). The preparation's CPU
is measured with :func:`time.thread_time` (the loop thread's CPU, not wall time: a
request waiting for its turn is not charged for the others' work) around its two
synchronous steps, parsing and tokenizing (prefix keys come after the prompt tokens are
reserved and cost O(those tokens): not metered; the two steps are one measured span, 1
thread-CPU read a request when it is short, 2 else, see :class:`CpuMeter`); a refused
request's measured CPU is taken from the bucket, which may go into debt. Accepted
requests pay in tokens; their preparation within the allowance below is not charged, so a
budget sized for refusals does not throttle a tenant's legitimate large prompts.
Session 6 (review R6-1, R6-2): refusals were not the only free work. An accepted chat carrying
an ignored field of 62,000 JSON values cost ~28 ms of preparation for ~8 prompt tokens, and a
request cancelled by its client while it waited in the flow queue was charged nothing at all. So
when a request ends (:meth:`CpuMeter.settle`, from :meth:`gateway.held.Held.release`), its
preparation CPU is charged: all of it when the request never reached a replica (refused,
cancelled, failed before dispatch: ``Held.progress == "none"``), else only the part above its
free allowance, ``limits.prep_cpu_free_ms`` + ``limits.prep_cpu_free_us_per_token`` x its
paid prompt tokens (reserved, or the replica's lower count the ledger charged: S21-review-2) (1 ms + 5 us/token by default: a plain 64-word prompt, ~0.06 ms, and a
maximal 8,192-token prompt, <= ~10 ms, are never charged; the junk chat pays ~all of it).
A tenant whose bucket is in debt is refused ``429 cpu_budget_exhausted`` with
``Retry-After`` right after authentication (before its body is read) and again before its
body is parsed (a body read awaits, and the tenant's other requests may have been charged
meanwhile), so one tenant's refused work is bounded by the rate plus the burst and at most
one request's preparation beyond it (with ``state.backend: redis``, whose steps await
between parse and tokenize: one per request of the tenant in flight).

The budget is per gateway process (CPU is per process), also under ``state.backend:
redis``. Used from the event-loop thread only (no lock). A bucket exists only for a tenant
once charged (at most one per configured tenant; a removed tenant's stays, a few bytes).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, ClassVar, ParamSpec, TypeVar

from gateway.admission import too_many
from gateway.answer_cost import ParseTurns, UnsentAnswers
from gateway.config_http import LimitsConfig
from gateway.errors import GatewayError
from gateway.gc_time import GC_TIME, GcTime
from gateway.metrics import GatewayMetrics
from tenancy.limits import TokenBucket
from tenancy.registry import Tenant

__all__ = ["CpuBudget", "CpuMeter", "NO_METER"]

P = ParamSpec("P")
R = TypeVar("R")


class CpuBudget:
    """Per-tenant buckets of CPU-seconds for the preparation of refused requests.

    ``limits``: ``limits.refused_cpu_ms_per_s`` (refill, CPU milliseconds per second;
    ``None``: no budget) and ``limits.refused_cpu_burst_ms`` (capacity, CPU milliseconds),
    overridden per tenant by :attr:`Tenant.refused_cpu_ms_per_s` /
    :attr:`Tenant.refused_cpu_burst_ms`. ``clock``: monotonic seconds (the refill);
    ``cpu_clock``: the calling thread's CPU seconds (the measurement; a system call, ~1 µs);
    ``wall_clock``: cheap wall seconds (bounds the gap between steps; with ``wall_bounds_cpu``, also a
    short span's CPU: by default true for the real clocks only, as a fake CPU clock may run ahead of a
    fake wall clock). ``metrics``: each charge is
    counted in ``prefixgate_tenant_refused_cpu_seconds_total{tenant}``.
    """

    def __init__(self, limits: LimitsConfig, *, clock: Callable[[], float] = time.monotonic,
                 cpu_clock: Callable[[], float] = time.thread_time, metrics: GatewayMetrics | None = None,
                 wall_clock: Callable[[], float] = time.perf_counter, wall_bounds_cpu: bool | None = None) -> None:
        self.rate_ms = limits.refused_cpu_ms_per_s
        self.burst_ms = limits.refused_cpu_burst_ms
        self.free_s = limits.prep_cpu_free_ms / 1000.0
        self.free_s_per_token = limits.prep_cpu_free_us_per_token / 1e6
        self.answer_free_s_per_token = limits.answer_cpu_free_us_per_token / 1e6
        self.answer_meter_bytes = limits.answer_cpu_meter_bytes
        self.max_answer_bytes = limits.max_answer_bytes
        #: large answer parses, one per loop step (R10b-2); unsent answer bytes per tenant (R10b-5)
        self.turns = ParseTurns()
        self.unsent = UnsentAnswers(limits.max_unsent_answer_bytes_per_tenant)
        self.clock = clock
        self.cpu_clock = cpu_clock
        self.wall_clock = wall_clock
        if wall_bounds_cpu is None:  # the real clocks: a thread's CPU never runs ahead of the wall clock
            wall_bounds_cpu = cpu_clock is time.thread_time and wall_clock is time.perf_counter
        #: spans up to this many wall seconds are charged their wall time (:attr:`CpuMeter.WALL_EXACT_S`; -1: never)
        self.wall_exact_s = CpuMeter.WALL_EXACT_S if wall_bounds_cpu else -1.0
        #: collector CPU subtracted from spans (F16-1; real CPU clock only: a fake one never counts it)
        self.gc_time = GC_TIME.install() if cpu_clock is time.thread_time else GcTime()
        self.metrics = metrics
        #: tenant id -> its CPU bucket; a tenant never charged has none (read by :class:`CpuMeter` to skip its check)
        self.buckets: dict[str, TokenBucket] = {}

    def _rate_burst(self, tenant: Tenant) -> tuple[float, float] | None:
        """``tenant``'s (rate CPU-s/s, burst CPU-s), or ``None`` (no budget)."""
        rate = tenant.refused_cpu_ms_per_s if tenant.refused_cpu_ms_per_s is not None else self.rate_ms
        if rate is None:
            return None
        burst = tenant.refused_cpu_burst_ms if tenant.refused_cpu_burst_ms is not None else self.burst_ms
        return rate / 1000.0, burst / 1000.0

    def check(self, tenant: Tenant) -> None:
        """Raise 429 ``cpu_budget_exhausted`` (``Retry-After``: seconds until the bucket is out
        of debt, at least 1) when ``tenant``'s bucket is in debt; else return. A tenant never
        charged has no bucket yet (a full one): a dictionary miss, the common case."""
        b = self.buckets.get(tenant.id)
        if b is None:
            return
        wait = b.try_take(0.0, self.clock(), allow_debt=True, need=0.0)  # takes nothing; 0.0: level >= 0
        if wait > 0:
            rb = self._rate_burst(tenant)  # a registry reload may have lifted or changed the budget
            if rb is None:
                del self.buckets[tenant.id]
                return
            if (b.rate, b.burst) != rb:
                b.reconfigure(*rb, self.clock())
                self.check(tenant)
                return
            raise too_many(wait, "cpu_budget_exhausted",
                           "tenant budget of gateway CPU for refused requests exhausted")

    def charge(self, tenant: Tenant, cpu_s: float) -> None:
        """Take ``cpu_s`` CPU-seconds from ``tenant``'s bucket (the level may go negative)."""
        rb = self._rate_burst(tenant)
        if rb is None or cpu_s <= 0:
            return
        now = self.clock()
        b = self.buckets.get(tenant.id)
        if b is None:
            b = self.buckets[tenant.id] = TokenBucket(*rb, now)
        elif (b.rate, b.burst) != rb:  # a registry reload changed it
            b.reconfigure(*rb, now)
        b.try_take(cpu_s, now, allow_debt=True, need=-math.inf)  # always taken: debt allowed
        if self.metrics is not None:
            self.metrics.tenant_refused_cpu.labels(tenant.id).inc(cpu_s)

    def meter(self, tenant: Tenant, steps: int = 2) -> CpuMeter:
        """:meth:`check` ``tenant`` (429 when in debt) and its unsent answer bytes (429
        ``unsent_answers_limited``, :class:`gateway.answer_cost.UnsentAnswers`, session 11), then a
        :class:`CpuMeter` of ``steps`` steps (:attr:`CpuMeter.STEPS`) for one of its requests."""
        if tenant.id in self.buckets:  # a tenant never charged has no bucket: no check call (session 14)
            self.check(tenant)
        self.unsent.check(tenant)
        return CpuMeter(self, tenant, steps)


class CpuMeter:
    """The preparation CPU of one request of ``tenant``: :meth:`run` measures a synchronous
    step, :meth:`refused` charges the sum to the tenant's budget (once), :meth:`settle` what a
    request's end owes (once, whichever comes first). ``cpu_s``: CPU seconds measured so far.

    Issue 14 (session 6): the thread-CPU clock is a system call (~1 µs here), so the
    request's :attr:`STEPS` steps (parse, tokenize) are measured as one span: read at the
    first step's start and the last step's end (2 reads instead of 4). Session 11: a span whose
    wall time (a vDSO clock, no system call) is at most :attr:`WALL_EXACT_S` is charged that wall
    time, an upper bound of its CPU (no await inside; the loop thread's preemption within it is
    the only excess, below 0.2 ms), so the common request reads the thread-CPU clock once; a
    longer span reads it again and is charged its CPU exactly. The gap between steps
    (the request's own checks) is inside the span; when that gap is longer than ``GAP_S`` of
    wall time (an await may have run other requests: a batch's sequence admission), the
    span is cut at the next step's start and its CPU bounded by its steps' wall time
    (``min(CPU of span with gap, wall of its steps)``, never below their CPU). A step that
    raises, :meth:`refused`, :meth:`settle` and reading :attr:`cpu_s` close the span.
    """

    __slots__ = ("budget", "tenant", "_cpu", "charged", "rechecked", "_t0", "_w0", "_wend", "_steps", "_g0", "steps")

    #: synchronous steps of a request's preparation by default (parse, tokenize); ``steps``: this meter's (session
    #: 19: gateway/pipeline.py's is 1, gateway/admission_front.py's one step; a later step is a span of its own)
    STEPS = 2
    GAP_S = 20e-6  # wall seconds between steps up to which the gap stays inside the span
    #: a span no longer than this in wall seconds (no await inside) is charged its wall time, which bounds
    #: its CPU from above, instead of a second thread-CPU read (session 11: one system call per request)
    WALL_EXACT_S: ClassVar[float] = 200e-6

    def __init__(self, budget: CpuBudget | None, tenant: Tenant | None, steps: int = STEPS) -> None:
        self.budget = budget
        self.tenant = tenant
        self.steps = steps
        self._cpu = 0.0
        self.charged = False
        self.rechecked = False
        self._t0: float | None = None  # thread CPU at the open span's start (None: no span open)
        self._w0 = 0.0  # wall clock at the open span's start
        self._wend = 0.0  # wall clock at the end of the open span's last step
        self._steps = 0
        self._g0 = 0.0  # collector CPU (gateway/gc_time.py) at the open span's start

    @property
    def cpu_s(self) -> float:
        """CPU seconds measured so far (closes an open span)."""
        self._close()
        return self._cpu

    def _close(self, exact: bool = False) -> None:
        """Add the open span's CPU (``exact``: a step just ended inside it, no await since)."""
        t0 = self._t0
        if t0 is None:
            return
        budget = self.budget
        assert budget is not None
        self._t0 = None
        wall = budget.wall_clock()
        gc_s = budget.gc_time.total_s - self._g0  # F16-1: the collector's CPU in the span is not the tenant's
        if not exact and wall - self._wend > self.GAP_S:
            span = min(budget.cpu_clock() - t0 - gc_s, self._wend - self._w0)
        elif wall - self._w0 <= budget.wall_exact_s:  # session 11: a short span's wall time bounds its CPU
            span = wall - self._w0 - gc_s
        else:
            span = budget.cpu_clock() - t0 - gc_s
        self._cpu += max(0.0, span)

    def run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Return ``fn(*args, **kwargs)`` (a synchronous step: no await inside), its thread CPU
        added to :attr:`cpu_s`, also when it raises. The first call raises 429
        ``cpu_budget_exhausted`` first, running nothing, when the tenant's bucket is in debt
        now (the body read before it awaited: the tenant's other requests may have been charged)."""
        budget = self.budget
        if budget is None:
            return fn(*args, **kwargs)
        t0 = self._t0
        if t0 is None:
            if not self.rechecked:  # (an open span means a step ran already: checked then)
                self.rechecked = True
                assert self.tenant is not None
                if self.tenant.id in budget.buckets:  # never charged: nothing to check (session 14)
                    budget.check(self.tenant)
            self._g0 = budget.gc_time.total_s
            self._w0 = budget.wall_clock()
            self._t0 = budget.cpu_clock()
        else:
            w = budget.wall_clock()
            if w - self._wend > self.GAP_S:  # a long gap: cut the span here (one read ends it and starts the next)
                c = budget.cpu_clock()
                g = budget.gc_time.total_s
                self._cpu += max(0.0, min(c - t0 - (g - self._g0), self._wend - self._w0))  # F16-1
                self._t0, self._w0, self._g0 = c, w, g
        try:
            out = fn(*args, **kwargs)
        except BaseException:
            self._close(exact=True)
            raise
        self._steps += 1
        if self._steps >= self.steps:
            self._close(exact=True)  # the last step: one rule for closing a span (its wall read is the step's)
        else:
            self._wend = budget.wall_clock()
        return out

    def check_step(self, always: bool = False) -> Callable[[], float]:
        """Before a step that runs on another thread (:class:`gateway.tokenize_thread.TokenizeThread`):
        raise 429 ``cpu_budget_exhausted`` like :meth:`run` when the tenant is in debt and this is
        its first step (``always``: whatever step it is; R12b-1), close the open span, and return the
        CPU clock to read on that thread."""
        budget = self.budget
        if budget is None:
            return time.thread_time
        if always or not self.rechecked:
            self.rechecked = True
            assert self.tenant is not None
            budget.check(self.tenant)
        self._close()
        return budget.cpu_clock

    def add_off_loop(self, cpu_s: float, late: bool = False) -> None:
        """Add ``cpu_s`` CPU seconds a step spent on another thread; ``late``: the request was
        cancelled while the step ran, so it is charged to the tenant now if its end already
        charged the rest (a request that never reached a replica pays all its preparation)."""
        self._steps += 1
        if late and self.charged and self.budget is not None and self.tenant is not None:
            self.budget.charge(self.tenant, cpu_s)
            return
        self._cpu += cpu_s

    def refused(self) -> None:
        """The request was refused: charge its measured CPU to the tenant's budget (once)."""
        if self.budget is not None and not self.charged:
            self.charged = True
            assert self.tenant is not None
            self.budget.charge(self.tenant, self.cpu_s)  # closes an open span

    def settle(self, dispatched: bool, prompt_tokens: int) -> None:
        """The request ended: charge (once) all its CPU when it was not ``dispatched`` to a replica
        (R6-2), else what exceeds ``limits.prep_cpu_free_ms`` + ``prep_cpu_free_us_per_token`` x
        ``prompt_tokens`` (R6-1); nothing if already charged by :meth:`refused`."""
        budget = self.budget
        if budget is None or self.charged:
            return
        if not dispatched:
            self.refused()
            return
        if self._t0 is not None:
            self._close()
        excess = self._cpu - budget.free_s - budget.free_s_per_token * max(0, prompt_tokens)
        self.charged = True
        if excess > 0:
            assert self.tenant is not None
            budget.charge(self.tenant, excess)

    def answer_turns(self, size: int) -> ParseTurns | None:
        """The gateway's :class:`gateway.answer_cost.ParseTurns` when a plain answer of ``size`` bytes is
        parsed metered (``answer_cpu_meter_bytes`` or more: take a turn first, R10b-2), else None."""
        budget = self.budget
        return budget.turns if budget is not None and size >= budget.answer_meter_bytes else None

    def answer_bounds(self) -> tuple[int | None, int | None]:
        """``(limits.max_answer_bytes, limits.answer_cpu_meter_bytes)`` of this request (each None: no
        bound, no metering): a plain answer smaller than the second is parsed unmetered, without
        :meth:`answer_turns`, :meth:`answer_refusal` or :meth:`check_answer` (each of which answers
        "nothing to do" for it; issue 14, session 14: one call on the common path, not four)."""
        budget = self.budget
        return (None, None) if budget is None else (budget.max_answer_bytes, budget.answer_meter_bytes)

    @property
    def answer_limit(self) -> int | None:
        """``limits.max_answer_bytes``: the most bytes of a plain answer (None: no bound)."""
        return self.budget.max_answer_bytes if self.budget is not None else None

    def note_unsent(self, scope: Any) -> None:
        """This request's plain answer was handed to the server on ``scope``'s connection (R10b-5)."""
        if self.budget is not None and self.tenant is not None:
            self.budget.unsent.note(self.tenant.id, scope)

    def answer_refusal(self, size: int) -> GatewayError | None:
        """The 429 ``cpu_budget_exhausted`` to send instead of checking a plain answer of ``size``
        bytes, or None (check it with :meth:`check_answer`).

        Review R10b-2 (session 10): :meth:`check_answer` charges a large answer's parse after it ran,
        so a burst of a tenant's concurrent ``logprobs`` requests, all admitted before the first
        charge, parsed every answer on the loop (8 answers of 5.9 MB: other tenants waited up to
        0.9 s). An answer of ``limits.answer_cpu_meter_bytes`` or more whose tenant is in debt
        when it arrives is now refused unparsed: the tenant's burst costs at most its parses
        until the bucket is empty, plus the ones in progress. The output is lost to the tenant
        (its tokens are charged as for any answer whose usage is unknown)."""
        budget = self.budget
        if budget is None or size < budget.answer_meter_bytes:
            return None
        assert self.tenant is not None
        try:
            budget.check(self.tenant)
        except GatewayError as err:
            return err
        return None

    def check_answer(self, parse: Callable[[bytes], dict[str, Any]], data: bytes) -> dict[str, Any]:
        """``parse(data)``: a replica's plain answer (``data``, bytes) checked; raises what ``parse`` raises.

        Review R10-4 (session 10): the gateway parses a plain answer on the event loop to check it and
        read its ``usage``, and its cost grows with what the tenant asked for (``top_logprobs: 20``:
        a 4,096-token answer is ~5.9 MB, ~84 ms of CPU, against ~0.1 ms without alternatives). An
        answer of ``limits.answer_cpu_meter_bytes`` or more is parsed under the thread-CPU clock, and
        the part of that CPU above ``limits.prep_cpu_free_ms`` + ``limits.answer_cpu_free_us_per_token``
        x its ``usage.completion_tokens`` (0 when it has none or does not parse) is charged to the
        tenant's budget at once, whether the parse succeeds or raises: the tenant's next requests
        answer 429 ``cpu_budget_exhausted`` while it is in debt. Smaller answers (every answer without
        alternatives up to ~10,000 tokens) are parsed unmeasured: no clock read on the common path.
        """
        budget = self.budget
        if budget is None or len(data) < budget.answer_meter_bytes:
            return parse(data)
        c0 = budget.cpu_clock()
        tokens = 0
        try:
            obj = parse(data)
            usage = obj.get("usage")
            if isinstance(usage, dict) and type(usage.get("completion_tokens")) is int:
                tokens = max(0, usage["completion_tokens"])
            return obj
        finally:
            spent = budget.cpu_clock() - c0
            excess = spent - budget.free_s - budget.answer_free_s_per_token * tokens
            if excess > 0:
                assert self.tenant is not None
                budget.charge(self.tenant, excess)


#: The meter of a request whose tenant is not known yet: runs steps unmeasured, charges nothing.
NO_METER = CpuMeter(None, None)
