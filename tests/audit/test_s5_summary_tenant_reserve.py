"""Review R4b-2 (session 5): one tenant that opens ``max_sources`` flood-summary keys (its own sources
or SPIFFE IDs) no longer turns every other tenant's new keys into ``*other*`` keys without source and
identity: each tenant keeps room for its first ``reserved_per_tenant`` keys; memory stays bounded."""
from __future__ import annotations

from audit.event import AuditEvent, Identity, Kind, Outcome, PolicyInfo
from audit.summary import OTHER_SOURCE, SummaryAggregator

TD = "demo.prefixgate.test"


def refused(t: int, tenant: str | None, workload: str, source: str) -> AuditEvent:
    ident = Identity(f"spiffe://{TD}/{tenant}/{workload}", TD) if tenant else Identity()
    return AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.REJECTED, time_ms=t, client_address=source,
                      tenant=tenant, identity=ident, status_code=400, error_code="invalid_request",
                      policy=PolicyInfo(None, "invalid_request", None))


def _fill(agg: SummaryAggregator, t0: int, n: int, tenant: str | None = "acme") -> None:
    for i in range(n):  # n distinct identities (or sources), each refused twice: first passes, second counted
        for k in range(2):
            agg.offer(refused(t0 + i, tenant, f"w{i}", f"10.0.{i // 250}.{i % 250}"))


def test_a_tenant_that_fills_the_table_leaves_others_their_identity() -> None:
    agg = SummaryAggregator(window_s=10, first_n=1, max_sources=50, reserved_per_tenant=4)
    t0 = 1_000_000
    _fill(agg, t0, 200)  # acme: 200 SPIFFE IDs, the table holds 50 keys
    for k in range(3):
        assert (agg.offer(refused(t0 + 500 + k, "globex", "billing", "192.0.2.9")) is None) == (k > 0)
    summaries = {(ev.tenant, ev.summary["source"]): ev for ev in agg.flush(t0 + 20_000)}
    globex = summaries[("globex", "192.0.2.9")]  # before: ("globex", "*other*"), no spiffe_id
    assert globex.summary["spiffe_id"] == f"spiffe://{TD}/globex/billing"
    assert globex.identity.spiffe_id == f"spiffe://{TD}/globex/billing" and globex.summary["suppressed"] == 2
    assert ("acme", OTHER_SOURCE) in summaries  # the tenant that overflowed shares its own bucket


def test_the_reserve_is_per_tenant_and_memory_stays_bounded() -> None:
    agg = SummaryAggregator(window_s=10, first_n=1, max_sources=50, reserved_per_tenant=4)
    t0 = 2_000_000
    _fill(agg, t0, 200)
    _fill(agg, t0, 200, tenant="globex")  # globex floods too: 4 reserved keys, then its own *other*
    _fill(agg, t0, 200, tenant=None)  # unauthenticated: no reserve
    assert agg.open_windows <= 50 + 2 * (4 + 1) + 1
    keys = [(ev.tenant, ev.summary["source"]) for ev in agg.flush(t0 + 20_000)]
    assert sum(t == "globex" and s != OTHER_SOURCE for t, s in keys) == 4
    assert ("globex", OTHER_SOURCE) in keys and (None, OTHER_SOURCE) in keys


def test_keys_are_released_by_the_flush() -> None:
    agg = SummaryAggregator(window_s=10, first_n=1, max_sources=10, reserved_per_tenant=2)
    t0 = 3_000_000
    _fill(agg, t0, 10)
    assert len(agg.flush(t0 + 20_000)) == 10 and agg.open_windows == 0
    _fill(agg, t0 + 30_000, 10, tenant="globex")  # a fresh table: globex's own sources, no overflow
    assert all(ev.summary["source"] != OTHER_SOURCE for ev in agg.flush(t0 + 60_000))
