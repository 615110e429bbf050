"""Session 19, helper fixq (S19-R4, S19-R5): what the target may hold that the store did not commit is given the
committed state of its key back (policy/store_repair.py ``TargetRepair``): after the push's outcome is known, at
once, and once more ``settle_s`` later when that outcome was not a success; a later committed change of the same
key is never undone by it. The review's own cases: tests/policy/test_s19_review_store.py."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from policy.loader import PolicySet
from policy.store import PolicyStore, PolicyTargetError
from policy.store_repair import restoring
from policy.store_types import ChangeRecord
from tests.policy.test_s19_review_store import EXTRA
from tests.support.waiting import holds_within

EXTRA2 = "package extra.a\n\nx := 2\n"


class LateOpa:
    """A remote OPA whose first put's reply is lost while the put is still queued at the server: it lands when
    ``land`` is set, after the client gave up. Records every change it applies, in order."""

    def __init__(self) -> None:
        self.modules: dict[str, str] = {}
        self.sent: list[tuple[str, str]] = []
        self.land = asyncio.Event()
        self.late: asyncio.Task[None] | None = None

    async def apply(self, change: ChangeRecord, policy_set: PolicySet) -> None:
        self.sent.append((change.op, change.target))
        if self.late is None and change.op == "put":
            text = policy_set.modules[change.target]

            async def lands() -> None:
                await self.land.wait()
                self.modules[change.target] = text
            self.late = asyncio.get_running_loop().create_task(lands())
            raise PolicyTargetError("remote OPA refused the change: ReadTimeout")
        if change.op == "put":
            self.modules[change.target] = policy_set.modules[change.target]
        else:
            self.modules.pop(change.target, None)


async def test_a_lost_push_that_lands_after_the_give_back_is_given_back_again(active: Path, tmp_path: Path) -> None:
    opa = LateOpa()
    store = PolicyStore(active, tmp_path / "versions", target=opa, settle_s=0.2)
    with pytest.raises(PolicyTargetError) as err:
        await store.put_policy("extra_a.rego", EXTRA, "ops")
    assert err.value.target_may_hold_change and "re-applied to the target now" in str(err.value)
    assert await holds_within(lambda: ("delete", "extra_a.rego") in opa.sent)  # the at-once give-back (404-like: done)
    opa.land.set()
    assert opa.late is not None
    await opa.late
    assert "extra_a.rego" in opa.modules  # the late landing
    assert await holds_within(lambda: "extra_a.rego" not in opa.modules), "the settle pass did not give it back"
    assert store.version == 0


async def test_a_settle_pass_gives_back_the_committed_state_never_a_stale_inverse(active: Path,
                                                                                 tmp_path: Path) -> None:
    opa = LateOpa()
    store = PolicyStore(active, tmp_path / "versions", target=opa, settle_s=0.2)
    with pytest.raises(PolicyTargetError):
        await store.put_policy("extra_a.rego", EXTRA, "ops")
    rec = await store.put_policy("extra_a.rego", EXTRA2, "ops")  # the operator sends it again: committed
    assert rec.version == 1 and opa.modules["extra_a.rego"] == EXTRA2
    assert await holds_within(lambda: opa.sent.count(("put", "extra_a.rego")) == 3)  # change, retry, settle pass
    assert opa.modules["extra_a.rego"] == EXTRA2  # a put of the committed text, not the failed change's delete


class HeldOpa:
    """Holds a put until ``reply`` is set (the client's await is cancellable, the server's work is not)."""

    def __init__(self) -> None:
        self.modules: dict[str, str] = {}
        self.sent: list[tuple[str, str]] = []
        self.reply = asyncio.Event()
        self.received = asyncio.Event()

    async def apply(self, change: ChangeRecord, policy_set: PolicySet) -> None:
        self.sent.append((change.op, change.target))
        if change.kind == "data":
            return
        if change.op == "put" and not self.reply.is_set():
            self.received.set()
            await self.reply.wait()
        if change.op == "put":
            self.modules[change.target] = policy_set.modules[change.target]
            self.sent.append(("done", change.target))
        else:
            self.modules.pop(change.target, None)


async def test_the_next_change_waits_for_a_cancelled_push_in_flight(active: Path, tmp_path: Path) -> None:
    opa = HeldOpa()
    store = PolicyStore(active, tmp_path / "versions", target=opa, settle_s=0)
    change = asyncio.get_running_loop().create_task(store.put_policy("extra_a.rego", EXTRA, "ops"))
    await opa.received.wait()
    change.cancel()
    with pytest.raises(asyncio.CancelledError):
        await change
    nxt = asyncio.get_running_loop().create_task(store.put_data("extra", {"k": 1}, "ops"))
    opa.reply.set()  # the server answers the put its client gave up on
    rec = await nxt
    assert rec.version == 1
    # the give-back (a delete) only after the put's outcome (before: at once, before "done": a 404, then it landed)
    assert opa.sent[:3] == [("put", "extra_a.rego"), ("done", "extra_a.rego"), ("delete", "extra_a.rego")]
    assert opa.sent[3:] == [("put", "extra")]
    assert "extra_a.rego" not in opa.modules and "extra_a.rego" not in store.policy_set.modules


def test_restoring_reads_the_committed_set() -> None:
    rec = ChangeRecord(version=3, who="ops", kind="policy", op="delete", target="a.rego", old_sha256="x",
                       new_sha256=None, time=0.0)
    held = PolicySet({"a.rego": "package a\n"}, {})
    assert restoring(rec, held).op == "put" and restoring(rec, PolicySet({}, {})).op == "delete"
    data = ChangeRecord(version=3, who="ops", kind="data", op="put", target="a/b", old_sha256=None,
                        new_sha256="y", time=0.0)
    assert restoring(data, PolicySet({}, {"a/b": {}})).op == "put" and restoring(data, held).op == "delete"


class StuckBackOpa(HeldOpa):
    """Takes the change at once; its first give-back (a delete) hangs until ``reply`` is set."""

    async def apply(self, change: ChangeRecord, policy_set: PolicySet) -> None:
        if change.op == "delete" and not self.reply.is_set():
            self.sent.append((change.op, change.target))
            self.received.set()
            await self.reply.wait()
            self.modules.pop(change.target, None)
            return
        self.sent.append((change.op, change.target))
        if change.op == "put":
            self.modules[change.target] = policy_set.modules[change.target]
        else:
            self.modules.pop(change.target, None)


async def test_a_cancel_during_the_give_back_after_a_failed_commit_still_gives_it_back(
        active: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The review's unregistered note: a cancel that lands while ``_roll_back`` gives the target the committed
    set back (a failed commit) left it pending until the next change; now a task gives it back at once."""
    from tests.policy.test_s18_store_commit import _fail_nth
    opa = StuckBackOpa()
    store = PolicyStore(active, tmp_path / "versions", target=opa, settle_s=0)
    _fail_nth(monkeypatch, 3)  # the version directory's rename fails: the change is given back
    change = asyncio.get_running_loop().create_task(store.put_policy("extra_a.rego", EXTRA, "ops"))
    await opa.received.wait()  # the give-back is in flight
    change.cancel()
    with pytest.raises(asyncio.CancelledError):
        await change
    monkeypatch.undo()
    opa.reply.set()
    assert await holds_within(lambda: opa.sent.count(("delete", "extra_a.rego")) == 2 and "extra_a.rego" not in opa.modules)
    assert store.version == 0 and "extra_a.rego" not in store.policy_set.modules
