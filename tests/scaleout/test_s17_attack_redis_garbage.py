"""Session 17, helper attack (S17-8): Redis answers something that is not a script reply.

Live (/work/notes/s17-attack/garbage.py: a TCP server on the Redis port answering every command the same
way, two gateways, globex sending): every reply shape failed closed (no request admitted), but only a
reset connection, an ``-ERR`` or silence was treated as "Redis unavailable" (503 ``state_unavailable``,
the ALERT log line, ``prefixgate_state_available`` 0). ``+OK`` / ``+PONG`` to a script call were read as a
rate-limit verdict: every tenant got 429 ``rate_limited`` (``Retry-After`` from the garbage: the reply's
second byte, 75 s for ``OK``), blaming its own traffic, and ``$-1`` / ``:1`` gave 500 ``internal_error``;
neither changed the availability state or raised the alert (tenancy/shared_lua.py ``wait_reply``,
tenancy/shared_limiter.py ``_raise``)."""
from __future__ import annotations

import pytest

from tenancy.limits import ConcurrencyLimited, RateLimited
from tenancy.shared_failover import unavailable_errors
from tenancy.shared_limiter import RedisTenantLimiter


def test_a_real_verdict_is_read() -> None:
    """What holds: the script's own replies."""
    RedisTenantLimiter._raise([b"ok", b"0"], "tenant_request_rate")
    with pytest.raises(RateLimited):
        RedisTenantLimiter._raise([b"rate", b"0.5"], "tenant_request_rate")
    with pytest.raises(ConcurrencyLimited):
        RedisTenantLimiter._raise([b"concurrency", b"1"], "tenant_request_rate")


@pytest.mark.parametrize("reply", [b"OK", b"PONG", None, 1, [b"ok"], [b"rate"], [b"bogus", b"x"]])
def test_a_malformed_reply_counts_as_redis_unavailable(reply) -> None:
    with pytest.raises(unavailable_errors()):
        RedisTenantLimiter._raise(reply, "tenant_request_rate")
