"""S19-R9 (helper fixpush): a remote OPA's policy and data pushes have their own deadline,
``policy.push_timeout_s`` (policy/remote.py: ``RemoteOpa.client`` is a second session with that total
timeout, same TLS context), while a decision keeps ``policy.timeout_s``.

The OPA stand-in holds requests on events, not on sleeps: a push is kept open until a decision has run
into its deadline (so the push provably lasted longer than one decision's deadline), or forever (so
it can only end by the push deadline).
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.config import ConfigError
from gateway.config_policy import PolicyConfig
from gateway.pep import build_decision_point
from policy.decision import PolicyUnavailableError
from policy.remote import RemoteOpa
from policy.store import PolicyStore, PolicyTargetError, RemoteOpaTarget
from tests.support.waiting import holds_within
from tests.support.opa_standin import StandInOpa, serving_opa

EXTRA = "package extra.a\n\nx := 1\n"


class HeldOpa(StandInOpa):
    """An OPA stand-in: decisions never answer; a push is applied at once, answered when ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.pushes_seen = asyncio.Event()

    async def after_push(self) -> None:
        self.pushes_seen.set()
        await self.until(self.release)

    async def before_decide(self) -> None:
        await self.gone.wait()  # never answers while the test runs


@pytest.fixture
async def held_opa() -> AsyncIterator[HeldOpa]:
    async with serving_opa(HeldOpa()) as opa:
        yield opa




async def _push_outlives_a_decision(opa: HeldOpa, decide: Callable[[], Any], push: Any) -> Any:
    """Start ``push``; once OPA holds it, a decision runs into its deadline; then OPA answers the push."""
    task = asyncio.ensure_future(push)
    await asyncio.wait_for(opa.pushes_seen.wait(), 10)
    with pytest.raises(PolicyUnavailableError):  # its deadline (asyncio or aiohttp total: both timeout_s)
        await decide()
    assert not task.done()  # the push is still waiting for OPA: it outlived a decision's whole deadline
    opa.release.set()
    return await task


async def test_a_decision_times_out_at_timeout_s_while_a_push_outlives_it(active: Path, tmp_path: Path,
                                                                         held_opa: HeldOpa) -> None:
    async with RemoteOpa(held_opa.url, timeout_s=0.1, push_timeout_s=30.0) as remote:
        store = PolicyStore(active, tmp_path / "versions", target=RemoteOpaTarget(remote.client), settle_s=0)
        rec = await _push_outlives_a_decision(held_opa, lambda: remote.decide({}),
                                              store.put_policy("extra_a.rego", EXTRA, "ops"))
        assert rec.version == 1 and held_opa.modules["extra_a.rego"] == EXTRA
        assert not held_opa.deletes  # confirmed: nothing given back


async def test_a_data_push_has_the_push_deadline_too(active: Path, tmp_path: Path, held_opa: HeldOpa) -> None:
    async with RemoteOpa(held_opa.url, timeout_s=0.1, push_timeout_s=30.0) as remote:
        store = PolicyStore(active, tmp_path / "versions", target=RemoteOpaTarget(remote.client), settle_s=0)
        rec = await _push_outlives_a_decision(held_opa, lambda: remote.decide({}),
                                              store.put_data("extra/limits", {"n": 3}, "ops"))
        assert rec.version == 1 and held_opa.data == {"extra/limits": {"n": 3}}


async def test_a_push_slower_than_push_timeout_s_is_a_lost_reply_and_given_back(active: Path, tmp_path: Path,
                                                                               held_opa: HeldOpa) -> None:
    async with RemoteOpa(held_opa.url, timeout_s=30.0, push_timeout_s=0.2) as remote:
        store = PolicyStore(active, tmp_path / "versions", target=RemoteOpaTarget(remote.client), settle_s=0)
        with pytest.raises(PolicyTargetError) as err:  # OPA applied the module but never answered
            await store.put_policy("extra_a.rego", EXTRA, "ops")
        assert err.value.target_may_hold_change
        assert await holds_within(lambda: "extra_a.rego" in held_opa.deletes, 10.0), "the lost push was not given back"
        assert "extra_a.rego" not in held_opa.modules
        assert all(r.target != "extra_a.rego" for r in store.history())  # nothing recorded


def test_push_timeout_s_is_validated_and_defaults_to_30_s() -> None:
    assert PolicyConfig().push_timeout_s == 30.0
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match="push_timeout_s"):
            PolicyConfig(push_timeout_s=bad)
        with pytest.raises(ValueError, match="push_timeout_s"):
            RemoteOpa("http://127.0.0.1:9", push_timeout_s=bad)


async def test_the_gateway_gives_pushes_push_timeout_s_and_decisions_timeout_s(active: Path, tmp_path: Path,
                                                                               held_opa: HeldOpa) -> None:
    pc = PolicyConfig(mode="remote", url=held_opa.url, timeout_s=0.1, push_timeout_s=30.0, dir=str(active),
                      versions_dir=str(tmp_path / "versions"), cache_key_fields=[])
    try:
        dp = build_decision_point(pc, audit=_Audit())  # type: ignore[arg-type]
    except ConfigError as exc:  # pragma: no cover - shows the reason
        pytest.fail(str(exc))
    assert dp.store is not None
    await dp.start()
    try:
        rec = await _push_outlives_a_decision(held_opa, lambda: dp.inner.decide({}),
                                              dp.store.put_policy("extra_a.rego", EXTRA, "ops"))
        assert rec.version == 1 and held_opa.modules["extra_a.rego"] == EXTRA
    finally:
        await dp.stop()


class _Audit:
    """The operator-audit hook the store calls on a change."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def record_operator(self, event: dict[str, Any]) -> None:
        self.records.append(event)
