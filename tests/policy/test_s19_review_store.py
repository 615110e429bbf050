"""Session 19 review of the R18-1 fix (policy/store.py ``_persist_and_apply``, ``_repair_soon``;
policy/store_types.py ``RemoteOpaTarget.apply``: a 404 on a delete is done).

S19-R4: when the admin request is cancelled while its push is in flight, the store gives the target the
inverse change at once (``_repair_soon``). But the push was already sent: a remote OPA keeps processing it
after the client went away (an HTTP request is not taken back by closing the client's side). For a put of
a NEW module the inverse is a delete; sent at once, it can reach OPA before the put is committed, OPA
answers 404, the store counts that as done (``_undo = None``), then the put commits: OPA decides with a
module that is on no disk, in no history and in no audit record, and nothing repairs it (the S17-5 state
R18-1 was about).

S19-R5: a change whose reply was lost (``PolicyTargetError``: a timeout, a reset) leaves the target holding
it until the NEXT change (``self._undo`` only); with no next change that is unbounded, while the cancel path
gives it back at once. The same window, two answers.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from opa_client.errors import DeletePolicyError

from policy.loader import PolicySet
from policy.store import PolicyStore, PolicyTargetError, RemoteOpaTarget
from policy.store_types import ChangeRecord
from tests.support.waiting import holds_within

EXTRA = "package extra.a\n\nx := 1\n"




class SlowOpa:
    """An AsyncOpaClient stand-in for a remote OPA whose server goes on with a request the client gave up on:
    a policy PUT is committed when ``commit`` is set (the client's await of it is cancellable, the server's
    work is not); a DELETE of a module it does not hold answers 404 (``resource_not_found``)."""

    def __init__(self) -> None:
        self.modules: dict[str, str] = {}
        self.received = asyncio.Event()
        self.commit = asyncio.Event()
        self.deletes: list[str] = []
        self.server: set[asyncio.Task[None]] = set()

    async def update_policy_from_string(self, text: str, name: str, rego_compat: bool = True) -> bool:
        async def serve() -> None:
            self.received.set()
            await self.commit.wait()
            self.modules[name] = text

        task = asyncio.get_running_loop().create_task(serve())
        self.server.add(task)
        await asyncio.shield(task)  # the client waits for the reply; its cancel does not stop the server
        return True

    async def delete_policy(self, name: str) -> bool:
        self.deletes.append(name)
        if name not in self.modules:
            raise DeletePolicyError("resource_not_found", f"storage_not_found_error: policy id {name!r}")
        del self.modules[name]
        return True


async def test_a_cancelled_push_still_in_flight_is_not_left_in_force(active: Path, tmp_path: Path) -> None:
    opa = SlowOpa()
    store = PolicyStore(active, tmp_path / "versions", target=RemoteOpaTarget(opa))  # type: ignore[arg-type]
    change = asyncio.get_running_loop().create_task(store.put_policy("extra_a.rego", EXTRA, "ops"))
    await opa.received.wait()  # the PUT reached OPA
    change.cancel()  # the operator's client hung up (or the admin request timed out)
    with pytest.raises(asyncio.CancelledError):
        await change
    assert store.version == 0 and "extra_a.rego" not in store.policy_set.modules
    await holds_within(lambda: bool(opa.deletes), 1.0)  # main: the store's at-once give-back (a 404: "done")
    opa.commit.set()  # OPA finishes the PUT it was working on
    await asyncio.gather(*opa.server)
    await holds_within(lambda: "extra_a.rego" not in opa.modules, 5.0)  # whatever give-back a fix runs after it
    assert "extra_a.rego" not in opa.modules, "OPA decides with a change the store answered as cancelled"


class LostReplyOpa:
    """Holds what it is sent; the first change's reply is lost after it was applied."""

    def __init__(self) -> None:
        self.modules: dict[str, str] = {}
        self.lose = True

    async def apply(self, change: ChangeRecord, policy_set: PolicySet) -> None:
        if change.op == "put":
            self.modules[change.target] = policy_set.modules[change.target]
        else:
            self.modules.pop(change.target, None)
        if self.lose:
            self.lose = False
            raise PolicyTargetError("remote OPA refused the change: ReadTimeout")


async def test_a_change_whose_reply_was_lost_is_given_back_without_a_next_change(active: Path, tmp_path: Path) -> None:
    opa = LostReplyOpa()
    store = PolicyStore(active, tmp_path / "versions", target=opa)
    with pytest.raises(PolicyTargetError) as err:
        await store.put_policy("extra_a.rego", EXTRA, "ops")
    assert err.value.target_may_hold_change
    assert await holds_within(lambda: "extra_a.rego" not in opa.modules, 5.0), \
        "the target still holds the change answered 502 (given back only before the next change)"
