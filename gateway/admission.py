"""Admission: tenant resolution, rate and concurrency limits, prompt and token checks, the token
ledger's reservation and the output-token clamp (``tenancy.limits``, ``tenancy.ledger``, ``tenancy.bounds``).

Every rule here answers one question: may this tenant's request take this much work now?
Errors are :class:`gateway.errors.GatewayError` (400, 403, 429).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from types import CoroutineType
from typing import Any

from gateway.admission_answers import check_prompt_bytes, clamp_output, state_unavailable, token_limited, too_many
from gateway.errors import GatewayError, model_not_found
from gateway.identity import WorkloadIdentity
from gateway.metrics import GatewayMetrics
from gateway.request import InferenceRequest
from policy.decision import Decision
from tenancy.bounds import RequestBounds, request_bounds
from tenancy.ledger import InProcessLedger, Reservation, Settlement, charge_for
from tenancy.limits import ConcurrencyLimited, Lease, RateLimited, TenantLimiter
from tenancy.prompt_room import PromptRoom, min_tokens
from tenancy.registry import Tenant, TenantRegistry
from tenancy.shared import SharedLimits, StateUnavailable
from tenancy.shared_failover import FailoverLedger, FailoverLimiter
from tenancy.shared_limiter import SharedLease
from tenancy.tokenizer import Tokenizer

__all__ = ["Admission", "SlotClaim", "clamp_output", "state_unavailable", "too_many"]


class Admission:
    """The admission step's rules over the tenant registry, limits, ledger and tokenizer.

    ``limits``: :func:`tenancy.shared.make_limits` of ``state`` (both
    backends, one async interface). With ``memory`` the admission methods
    call the in-process classes directly (no extra await hop, today's
    arithmetic on ``time.monotonic()``); with ``redis`` they await the
    shared limiter and ledger (the Redis server's clock). ``limiter`` and
    ``ledger`` are the in-process :class:`TenantLimiter` /
    :class:`InProcessLedger` (memory) or the Redis failover ones
    (:func:`~tenancy.shared.make_limits` with ``failover=True``, as :func:`gateway.build.build` makes them).
    ``registry`` is replaced by :meth:`replace_registry` on an operator's
    reload; everything else is fixed at build time.
    """

    def __init__(self, registry: TenantRegistry, limits: SharedLimits, tokenizer: Tokenizer,
                 served_models: Iterable[str], metrics: GatewayMetrics, *,
                 max_messages: int, max_output_tokens: int, default_max_prompt_tokens: int | None = None) -> None:
        self.registry = registry
        self.limits = limits
        self.local = limits.backend == "memory"
        self.limiter: TenantLimiter | FailoverLimiter = limits.limiter.inner if self.local else limits.limiter
        self.ledger: InProcessLedger | FailoverLedger = limits.ledger.inner if self.local else limits.ledger
        self.tokenizer = tokenizer
        self.served_models = frozenset(served_models)
        self.metrics = metrics
        self.max_messages = max_messages
        self.default_max_prompt_tokens = default_max_prompt_tokens  # limits.max_prompt_tokens
        self.max_output_tokens = max_output_tokens
        self._bounds: dict[str, tuple[Tenant, RequestBounds]] = {}  # request_bounds per Tenant object
        self._reserved: dict[str, tuple[Any, ...]] = {}  # per tenant id: its token counters' children
        self._settled: dict[str, tuple[Any, ...]] = {}

    def replace_registry(self, registry: TenantRegistry) -> None:
        """Serve ``registry``; free removed tenants' in-process buckets and ledger state (Redis's expire)."""
        self.registry = registry
        keep = {t.id for t in registry.tenants()}
        self.limiter.forget(keep)
        self.ledger.forget(keep)

    def _unavailable(self, exc: StateUnavailable) -> GatewayError:
        self.metrics.state_unavailable_admissions.labels("refused").inc()
        return state_unavailable(exc)

    def resolve_tenant(self, identity: WorkloadIdentity) -> Tenant:
        """Map a workload to its tenant; raises 403 for an unmapped workload."""
        tenant = self.registry.resolve(identity.spiffe_id.uri)
        if tenant is None:
            raise GatewayError(403, "unknown_workload", "this workload is not mapped to any tenant")
        return tenant

    def listed_models(self, tenant: Tenant) -> list[str]:
        """The models ``GET /v1/models`` lists for ``tenant`` (sorted): served and in its registry entitlement (the
        policy's ``input.tenant.models`` too: tests/quickstart/test_i13_one_source.py)."""
        return sorted(m for m in self.served_models if m in tenant.models)

    async def admit(self, tenant: Tenant, *, slot: bool = True) -> Lease | SharedLease:
        """Check the tenant's request rate and concurrency; returns a lease (release it). 429 when limited;
        503 ``state_unavailable`` when the shared state does not answer (``state.on_unavailable: fail_closed``).
        ``slot=False`` (flow control on): the slot is taken when the request leaves its queue (:meth:`slot_claim`)."""
        if self.local:  # memory: synchronous, no await hop
            return self.admit_now(tenant, slot=slot)  # type: ignore[return-value]
        try:
            return await self.limiter.admit(tenant, slot=slot)  # type: ignore[misc]
        except (StateUnavailable, RateLimited, ConcurrencyLimited) as exc:
            raise self._limited(exc) from None

    def admit_now(self, tenant: Tenant, *, slot: bool = True) -> Lease | Awaitable[Lease | SharedLease]:
        """:meth:`admit`'s lease at once with the in-process limiter (no coroutine: issue 14, session 16), else
        :meth:`admit`'s awaitable (Redis). Raises as :meth:`admit`."""
        if not self.local:
            return self.admit(tenant, slot=slot)
        try:
            return self.limiter.admit(tenant, time.monotonic(), slot=slot)  # type: ignore[return-value]
        except (RateLimited, ConcurrencyLimited) as exc:
            raise self._limited(exc) from None

    def _limited(self, exc: Exception) -> GatewayError:
        """The answer to a limiter's refusal of a new request (429, or 503 ``state_unavailable``)."""
        if isinstance(exc, StateUnavailable):
            return self._unavailable(exc)
        if isinstance(exc, RateLimited):
            return too_many(exc.retry_after_s, "rate_limited", "tenant request rate exceeded")
        assert isinstance(exc, ConcurrencyLimited)
        return too_many(exc.retry_after_s, "concurrency_limited", "tenant concurrent request limit reached")

    def slot_claim(self, tenant: Tenant, lease: Lease | SharedLease) -> SlotClaim:
        """The slots ``lease`` (admitted with ``slot=False``) takes when flow control releases it (gateway/flow.py)."""
        return SlotClaim(self, tenant, lease)

    def request_bounds(self, tenant: Tenant) -> RequestBounds:
        """The tenant's effective per-request bounds (see :mod:`tenancy.bounds`), kept per Tenant
        object (frozen; a registry reload hands out new objects) and tenant id (issue 14: not
        rebuilt per request)."""
        got = self._bounds.get(tenant.id)
        if got is not None and got[0] is tenant:
            return got[1]
        bounds = request_bounds(tenant, self.tokenizer, max_messages_ceiling=self.max_messages,
                                default_max_prompt_tokens=self.default_max_prompt_tokens)
        if len(self._bounds) >= 4096:  # bounded like gateway/pep_key.py's memo
            self._bounds.clear()
        self._bounds[tenant.id] = (tenant, bounds)
        return bounds

    def check_model(self, model: str, tenant: Tenant) -> None:
        """404 ``model_not_found`` for a model the gateway does not serve, and the same 404
        (same body, raised at the same step) for a served model ``tenant`` is not entitled to (``tenancy.tenants[]
        .models``): the answer is no oracle for other tenants' model names (R3-7). The audit event keeps the reason:
        ``reason_code`` ``model_not_entitled``, outcome ``denied``, the (served) model name. An unknown name is
        client-chosen: never copied into the audit trail."""
        if model not in self.served_models:
            raise model_not_found()
        if model not in tenant.models:
            raise model_not_found(record={"reason_code": "model_not_entitled", "model": model}, outcome="denied")

    def check_request(self, req: InferenceRequest, tenant: Tenant) -> None:
        """The parsed request against the tenant's entitlements: :meth:`check_model`, then
        400 ``prompt_logprobs_not_allowed`` (param ``echo``) for a completion with ``echo: true``
        and any ``logprobs`` unless ``tenant.allow_prompt_logprobs`` (R4-12): vLLM then computes
        log-probabilities for every prompt token (``prompt_logprobs = logprobs``), an engine cost
        the gateway does not charge. ``echo`` or ``logprobs`` alone are served. Reads no field of
        ``req.body`` (a queued request's is emptied; session 18, R18-3)."""
        if (model := req.model) not in tenant.models or model not in self.served_models:  # = check_model (s18:
            self.check_model(model, tenant)  # its call only when it raises; its served-model test first)
        if req.prompt_logprobs and not tenant.allow_prompt_logprobs:  # a fact of the parse: req.body may be gone
            raise GatewayError(400, "prompt_logprobs_not_allowed",
                               "echo with logprobs (log-probabilities of every prompt token) is not enabled "
                               "for this tenant; send echo or logprobs alone", param="echo")

    async def admit_sequences(self, tenant: Tenant, lease: Lease | SharedLease, sequences: int, *,
                              slots: bool = True) -> None:
        """A batch of ``sequences`` prompts takes that many request units and concurrency slots
        (the first was taken by :meth:`admit`); 429 when they are not available (503 as :meth:`admit`).
        ``slots=False`` (flow control on): request units only; a batch larger than the
        tenant's concurrency could never be released and is refused here (429 ``concurrency_limited``)."""
        if sequences <= 1:
            return
        lim = self.limiter
        try:
            if not slots and tenant.max_concurrency is not None and sequences > tenant.max_concurrency:
                raise ConcurrencyLimited(1.0, "tenant_concurrency")
            if isinstance(lim, TenantLimiter):
                assert isinstance(lease, Lease)  # the in-process limiter gave it
                lim.add_sequences(tenant, lease, sequences - 1, time.monotonic(), slots=slots)
            else:
                await lim.add_sequences(tenant, lease, sequences - 1, slots=slots)
        except StateUnavailable as exc:
            raise self._unavailable(exc) from None
        except RateLimited as exc:
            raise too_many(exc.retry_after_s, "rate_limited", "tenant request rate exceeded") from None
        except ConcurrencyLimited as exc:
            raise too_many(exc.retry_after_s, "concurrency_limited",
                           "tenant concurrent request limit reached (each prompt of a batch takes a slot)") from None

    def prompt_room(self, tenant: Tenant, lease: Lease | SharedLease | None = None) -> PromptRoom | None:
        """What ``tenant``'s prompt-token bucket admits now, read before tokenizing (review R3-2;
        :mod:`tenancy.prompt_room`). ``None``: any prompt (no limit, a full bucket). With the Redis
        backend, ``lease`` (from :meth:`admit`) carries the shared bucket's level read by the admit
        script (no extra round trip); without it the shared level is not known (``None``)."""
        led = self.ledger
        if isinstance(led, InProcessLedger):  # no prompt-token limit: None without its call (s18)
            return None if tenant.prompt_tokens_per_s is None else led.prompt_room(tenant)
        return led.prompt_room(tenant, lease)

    def prompt_tokens(self, bounds: RequestBounds, req: InferenceRequest,
                      room: PromptRoom | None = None) -> tuple[list[int], int]:
        """Size-check and tokenize each sequence of ``req``; return (tokens to hash, total prompt tokens).

        Cheapest first: each sequence's UTF-8 size (with the chat request's
        tools and other token-bearing fields, ``req.extra_text``) against
        ``max_prompt_bytes`` (400 ``prompt_too_large``, nothing tokenized);
        with ``room`` (:meth:`prompt_room`), the request's size against the
        tokenizer's byte bound of ``room.cap`` tokens (429 ``token_rate_limited``,
        nothing tokenized: the size alone proves more tokens than the bucket
        admits); then tokens with early stop at ``min(max_prompt_tokens,
        tokens the bucket still admits) + 1``: over ``max_prompt_tokens``, 400
        ``context_length_exceeded``; else over the bucket, 429
        ``token_rate_limited`` with ``Retry-After``. So the work is
        O(min(max_prompt_tokens, room.cap)) tokens, and an admitted count is
        exact. The tokens to hash are the prompt's own (``extra_text`` is
        counted, never hashed). Sets ``req.longest_prompt_tokens`` (fixq-2).
        """
        limit, max_bytes = bounds.max_prompt_tokens, bounds.max_prompt_bytes
        if max_bytes is not None:
            check_prompt_bytes(req.prompt_bytes, max_bytes)
        texts = len(req.prompts) + (1 if req.extra_text else 0)
        if room is not None and sum(req.prompt_bytes) > self.tokenizer.max_text_bytes(room.cap + texts - 1):
            raise self._over_room(room, room.cap + 1, req, texts)
        hashed: list[int] | None = None  # the first sequence's own list (session 15: no copy of it)
        total = longest = 0
        for i, text in enumerate(req.prompts):
            lim = limit
            if room is not None:
                lim = room.cap - total if limit is None else min(limit, room.cap - total)
            ids = self.tokenizer.encode(text, lim)
            n = len(ids)
            if i == 0 and req.extra_text:
                n += len(self.tokenizer.encode(req.extra_text, None if lim is None else max(0, lim - n)))
            if lim is not None and n > lim:
                if limit is not None and n > limit:
                    raise GatewayError(400, "context_length_exceeded",
                                       f"prompt has more than {limit} tokens; this tenant's limit is {limit}"
                                       + (" per prompt" if len(req.prompts) > 1 else ""))
                assert room is not None  # only the bucket's room can make lim < n <= limit
                raise self._over_room(room, total + n, req, texts)
            if hashed is None or i == 1:  # a batch's ids in order: the first prompt's own list, one copy at
                hashed = ids if hashed is None else hashed + ids  # the second, then extended (R15-1: not a copy
            else:  # per prompt: quadratic in the batch)
                hashed.extend(ids)
            total += n
            longest = n if n > longest else longest
        req.longest_prompt_tokens = longest  # fixq-2: what a re-decision checks against max_prompt_tokens
        return (hashed if hashed is not None else []), total

    def _over_room(self, room: PromptRoom, at_least: int, req: InferenceRequest, texts: int) -> GatewayError:
        """429 ``token_rate_limited`` for a prompt of more than ``room.cap`` tokens (at least
        ``at_least``, or what its size proves); ``Retry-After``: until the bucket admits that."""
        at_least = max(at_least, min_tokens(self.tokenizer, sum(req.prompt_bytes), texts))
        return too_many(room.wait_s(at_least), "token_rate_limited", "tenant prompt-token rate exceeded")

    async def check_prompt(self, tenant: Tenant, prompt_tokens: int, sequences: int = 1,
                     output_tokens: int = 0) -> Reservation:
        """Per-request prompt size, then reserve the request's tokens in the ledger (400 / 429).

        ``prompt_tokens`` is the total of all ``sequences`` (the per-sequence limit was checked while counting);
        ``output_tokens``: the most output it may produce (``max_tokens`` x
        sequences, before the policy may lower it: :meth:`Reservation.lower_output`).
        Returns the :class:`~tenancy.ledger.Reservation` the request's end
        settles (:meth:`settle`); 429 ``token_rate_limited`` when the tenant's
        prompt- or output-token bucket cannot cover it (nothing is taken then); 503 as :meth:`admit`.
        """
        got = self.check_prompt_now(tenant, prompt_tokens, sequences, output_tokens)
        return await got if type(got) is CoroutineType else got  # type: ignore[return-value]

    def check_prompt_now(self, tenant: Tenant, prompt_tokens: int, sequences: int = 1,
                         output_tokens: int = 0) -> Reservation | Awaitable[Reservation]:
        """:meth:`check_prompt`'s reservation at once with the in-process ledger (no coroutine: issue 14,
        session 16), else the awaitable of the Redis ledger's. Raises as :meth:`check_prompt`."""
        if prompt_tokens == 0:
            raise GatewayError(400, "invalid_request", "prompt must not be empty", param="prompt")
        limit = tenant.max_prompt_tokens if tenant.max_prompt_tokens is not None else self.default_max_prompt_tokens
        if limit is not None and prompt_tokens > limit * max(1, sequences):
            raise GatewayError(400, "context_length_exceeded",
                               f"prompt has {prompt_tokens} tokens; this tenant's limit is {limit}", client_text=True)
        led = self.ledger
        if not isinstance(led, InProcessLedger):
            return self._reserve_shared(tenant, prompt_tokens, output_tokens)
        try:
            res = led.reserve(tenant, prompt_tokens, output_tokens, time.monotonic())
        except RateLimited as exc:
            raise token_limited(exc) from None
        self._count_reserved(tenant.id, prompt_tokens, output_tokens)
        return res

    async def _reserve_shared(self, tenant: Tenant, prompt_tokens: int, output_tokens: int) -> Reservation:
        try:
            res = await self.ledger.reserve(tenant, prompt_tokens, output_tokens)  # type: ignore[misc]
        except StateUnavailable as exc:
            raise self._unavailable(exc) from None
        except RateLimited as exc:
            raise token_limited(exc) from None
        self._count_reserved(tenant.id, prompt_tokens, output_tokens)
        return res  # type: ignore[no-any-return]

    def _count_reserved(self, tid: str, prompt_tokens: int, output_tokens: int) -> None:
        reserved_prompt, reserved_output = (self._reserved.get(tid)
                                            or self._children(self._reserved, tid, (self.metrics.tenant_tokens_reserved,)))
        self.metrics.batch.add(((reserved_prompt, prompt_tokens), (reserved_output, output_tokens)))

    @staticmethod
    def _children(memo: dict[str, tuple[Any, ...]], tenant_id: str, families: tuple[Any, ...]) -> tuple[Any, ...]:
        """The counter children ``(families[0] prompt, families[1] output, families[2] prompt, ...)`` of
        ``tenant_id``, looked up once per tenant (issue 14: a ``labels()`` call is ~0.5 us; the
        families' children are never removed) and kept in ``memo`` (emptied at 4096 tenants)."""
        got = memo.get(tenant_id)
        if got is None:
            if len(memo) >= 4096:
                memo.clear()
            got = memo[tenant_id] = tuple(f.labels(tenant_id, kind) for f in families for kind in ("prompt", "output"))
        return got

    def output_cap(self, requested: int | None, tenant: Tenant) -> int:
        """The most output tokens per sequence before the policy decision (its cap can only lower it)."""
        return clamp_output(requested, tenant.max_output_tokens, None, self.max_output_tokens)

    def clamp_max_tokens(self, requested: int | None, tenant: Tenant, decision: Decision) -> int:
        """Output-token cap: request → min(tenant cap, policy cap, gateway cap); absent → that cap."""
        return clamp_output(requested, tenant.max_output_tokens, decision.max_tokens, self.max_output_tokens)

    def lower_reservation(self, res: Reservation, output_tokens: int) -> None:
        """The policy lowered ``max_tokens``: hold only ``output_tokens`` (the rest refunded now)."""
        before = res.output_tokens
        res.lower_output(output_tokens)
        if res.output_tokens < before:
            self.metrics.tenant_tokens_refunded.labels(res.tenant_id, "output").inc(before - res.output_tokens)

    def settle(self, res: Reservation, *, usage: dict[str, object] | None, progress: str,
               relayed_output: int, counted: list[Callable[[], None]] | None = None) -> Settlement:
        """Settle a request's reservation however it ended (:func:`tenancy.ledger.charge_for`), counted per tenant; with
        ``counted``, the buckets' refund (:meth:`Reservation.settle_later`; debt now) and the count are appended to it."""
        prompt, output, basis = charge_for(res.prompt_tokens, res.output_tokens, usage=usage,
                                           progress=progress, relayed_output=relayed_output)
        already = res.settlement
        if counted is None:
            s = res.settle(prompt, output, basis)
            if already is None:
                self._count_settlement(res.tenant_id, s)
            return s
        s, refund = res.settle_later(prompt, output, basis)
        if refund is not None:  # the ledger's refund first: it must not wait on a metric's failure
            counted.append(refund)
        if already is None:
            counted.append(partial(self._count_settlement, res.tenant_id, s))
        return s

    def _count_settlement(self, tid: str, s: Settlement) -> None:
        m = self.metrics
        cp, co, rp, ro = (self._settled.get(tid)  # no _children call once looked up (session 17)
                          or self._children(self._settled, tid, (m.tenant_tokens_charged, m.tenant_tokens_refunded)))
        m.batch.add(((cp, s.charged_prompt), (co, s.charged_output), (rp, s.refunded_prompt),
                     (ro, s.refunded_output), (m.tenant_charges.labels(tid, s.basis), 1)))


class SlotClaim:
    """The tenant concurrency slots of one admitted request, taken when flow control releases it
    from its queue (a queued request holds none; docs/fairness.md, "Concurrency slots").

    :meth:`take_now` answers at once where no Redis answer is needed (the in-process limiter,
    or a lease admitted locally during a Redis outage): True (taken), False (the tenant is at
    ``max_concurrency``), None (ask :meth:`take`). :meth:`take` awaits the shared limiter:
    True or False as above; raises 503 ``state_unavailable`` when Redis does not answer.
    """

    __slots__ = ("_adm", "tenant", "lease")

    def __init__(self, admission: Admission, tenant: Tenant, lease: Lease | SharedLease) -> None:
        self._adm = admission
        self.tenant = tenant
        self.lease = lease

    @property
    def local(self) -> bool:
        """True when :meth:`take_now` always answers True or False (the in-process limiter)."""
        return bool(self._adm.local)

    def take_now(self, n: int) -> bool | None:
        """Take ``n`` slots now if that needs no await (see class doc)."""
        adm = self._adm
        if adm.local:
            try:
                adm.limiter.take_slots(self.tenant, self.lease, n)
            except ConcurrencyLimited:
                return False
            return True
        return adm.limiter.take_slots_now(self.tenant, self.lease, n)

    async def take(self, n: int) -> bool:
        """Take ``n`` slots through the shared limiter (see class doc)."""
        try:
            await self._adm.limiter.take_slots(self.tenant, self.lease, n)
        except ConcurrencyLimited:
            return False
        except StateUnavailable as exc:
            raise self._adm._unavailable(exc) from None
        return True
