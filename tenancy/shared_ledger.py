"""The token ledger shared by all instances through Redis (issue 16): :class:`RedisLedger`.

Same semantics as :class:`tenancy.ledger.InProcessLedger` (tests compare
them): ``reserve`` is ``async``; ``lower_output`` / ``settle`` are synchronous
and queued on the store's writer (the ledger's "never block" rule).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from tenancy.ledger import LedgerReservation, LedgerTotals, Settlement
from tenancy.limits import RateLimited
from tenancy.registry import Tenant
from tenancy.shared_lua import arg as _arg
from tenancy.shared_lua import malformed
from tenancy.shared_lua import wait_reply as _wait
from tenancy.shared_store import NOT_UTF8, Store, record_number, record_text
from tenancy.tenant_schema import TENANT_ID_PATTERN

__all__ = ["RedisLedger", "RedisReservation"]

log = logging.getLogger("prefixgate.state")
_TENANT_ID = re.compile(TENANT_ID_PATTERN)

#: the fields of a tenant's ``led:tot`` hash (the APPLY / RESERVE scripts write them; an absent one is 0)
_TOTAL_FIELDS = ("reserved_prompt", "reserved_output", "charged_prompt", "charged_output", "refunded_prompt",
                 "refunded_output", "open")

# --- ledger -------------------------------------------------------------------------------------


class RedisReservation(LedgerReservation):
    """A reservation held in Redis buckets; :meth:`settle` / :meth:`lower_output` queue their update
    (synchronous, never block; see the module doc)."""

    def __init__(self, ledger: RedisLedger, tenant_id: str, prompt: int, output: int) -> None:
        super().__init__(tenant_id, prompt, output)
        self._ledger = ledger

    def _apply(self, d_prompt: int, d_output: int, settled: Settlement | None) -> None:
        self._ledger._adjust(self.tenant_id, d_prompt, d_output, "lower" if settled is None else "settle", settled)


class RedisLedger:
    """:class:`tenancy.ledger.InProcessLedger` over Redis, shared by every instance of the store.

    :meth:`reserve` is ``async`` (Redis decides); the returned
    :class:`RedisReservation` has the synchronous ``lower_output`` /
    ``settle`` of :class:`tenancy.ledger.Reservation`, whose updates are
    queued in order. :meth:`totals` and :meth:`level` read Redis (call
    :meth:`SharedLimits.flush` first to see queued updates).
    """

    def __init__(self, store: Store, clock: Callable[[], float] | None = None) -> None:
        self._s = store
        self._clock = clock
        #: members / tenants :meth:`totals` left out (not UTF-8, a field not a number), every read counted
        self.foreign_totals = 0

    async def reserve(self, tenant: Tenant, prompt_tokens: int, output_tokens: int,
                      now: float | None = None) -> RedisReservation:
        """See :meth:`tenancy.ledger.TokenLedger.reserve` (same errors and reasons)."""
        if prompt_tokens < 0 or output_tokens < 0:
            raise ValueError("token count must be >= 0")
        pr, ore = tenant.prompt_tokens_per_s, tenant.output_tokens_per_s
        pb = None if pr is None else (tenant.prompt_tokens_burst if tenant.prompt_tokens_burst is not None
                                      else max(1.0, pr))
        ob = None if ore is None else (tenant.output_tokens_burst if tenant.output_tokens_burst is not None
                                       else max(1.0, ore))
        s = self._s
        if now is None and self._clock is not None:
            now = self._clock()
        reply = await s.reserve(
            keys=[s.key(tenant.id, "led:ptok"), s.key(tenant.id, "led:otok"), s.key(tenant.id, "led:tot"),
                  f"{s.prefix}ledger:tenants"],
            args=[_arg(now), _arg(pr), _arg(pb), prompt_tokens, _arg(ore), _arg(ob), output_tokens, tenant.id])
        reason, wait = _wait(reply)  # a malformed reply: Redis unavailable (S17-8)
        if reason not in ("ok", "tenant_prompt_tokens", "tenant_output_tokens"):
            raise malformed(f"reason {reason!r}")
        if reason != "ok":
            raise RateLimited(wait, reason)
        return RedisReservation(self, tenant.id, prompt_tokens, output_tokens)

    async def totals(self) -> Mapping[str, LedgerTotals]:
        """Per-tenant totals (tokens) across all instances, by tenant id.

        Every member of ``ledger:tenants`` and every totals field read is checked with the rules of
        the shared records (:func:`tenancy.shared_store.record_text`, :func:`record_number`: 1-20
        ASCII digits up to 2**64 - 1; no script writes anything else): a member that is not UTF-8,
        or a tenant whose totals hold a field that is not such a number, is left out of the answer,
        counted in :attr:`foreign_totals` and logged: one warning per read (the counts, up to three
        tenant ids, a member that is not one only by its length: never its bytes); the other tenants
        are answered. A bare ``decode()`` / ``int()`` made the whole read raise (session 22,
        S21-fixutf8-3). Raises only what the Redis client raises."""
        s = self._s
        out: dict[str, LedgerTotals] = {}
        not_utf8 = 0
        not_numbers: list[str] = []
        for raw in sorted(await s.client.smembers(f"{s.prefix}ledger:tenants")):
            tid = record_text(raw)
            if tid.startswith(NOT_UTF8):
                not_utf8 += 1
                continue
            h = {record_text(k): record_text(v) for k, v in (await s.client.hgetall(s.key(tid, "led:tot"))).items()}
            n = {f: record_number(h[f]) for f in _TOTAL_FIELDS if f in h}
            if None in n.values():
                not_numbers.append(tid if _TENANT_ID.match(tid) else f"<{len(raw)} bytes, not a tenant id>")
                continue
            out[tid] = LedgerTotals(
                {"prompt": n.get("reserved_prompt", 0), "output": n.get("reserved_output", 0)},
                {"prompt": n.get("charged_prompt", 0), "output": n.get("charged_output", 0)},
                {"prompt": n.get("refunded_prompt", 0), "output": n.get("refunded_output", 0)},
                n.get("open", 0))
        if not_utf8 or not_numbers:
            self.foreign_totals += not_utf8 + len(not_numbers)
            log.warning("shared state: ledger totals skipped %d ledger:tenants members that are not UTF-8 and %d "
                        "tenants whose totals hold a field that is not a number (%s)", not_utf8, len(not_numbers),
                        ", ".join(not_numbers[:3]) or "-")
        return out

    async def level(self, tenant_id: str, kind: str, now: float | None = None) -> float | None:
        """Level of a tenant's ``prompt`` / ``output`` bucket refilled to ``now`` (None: no bucket).

        Refills the stored bucket as :meth:`tenancy.ledger.InProcessLedger.level` does."""
        key = self._s.key(tenant_id, "led:ptok" if kind == "prompt" else "led:otok")
        if now is None and self._clock is not None:
            now = self._clock()
        raw = await self._s.level(keys=[key], args=[_arg(now)])
        if raw is None:
            return None
        try:
            level = float(raw.decode("ascii") if isinstance(raw, bytes) else raw)
        except (UnicodeDecodeError, ValueError, TypeError):
            raise malformed("not a level") from None
        if not math.isfinite(level):
            raise malformed("not a level")
        return level

    def _adjust(self, tenant_id: str, d_prompt: int, d_output: int, mode: str, s: Settlement | None) -> None:
        st = self._s
        args: list[Any] = ["a", d_prompt, d_output, mode]
        if s is not None:
            args += [s.charged_prompt, s.charged_output, s.refunded_prompt, s.refunded_output]
        else:
            args += [0, 0, 0, 0]
        # the settle time: refill to it before applying (InProcessLedger._adjust); taken now, not
        # when the queued update runs
        args.append(_arg(None if self._clock is None else self._clock()))
        st.writer.submit(st.update_keys(tenant_id), args)

