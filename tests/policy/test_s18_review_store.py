"""Session 18 review of the policy store (helper store's R17-3/SF17-2 work).

R18-1: a target that APPLIED a change and then failed to answer (a remote OPA whose reply is lost: a
timeout, a reset connection; or the admin request cancelled while the push was in flight) is answered
502 ``target_refused`` and the disk is rolled back, but the target is never given the committed set
back (``_persist_and_apply``'s ``except BaseException`` only rolls the disk back; ``_undo`` is set only
on the rename path). The target keeps deciding with a change that is neither on disk, nor in the
history, nor in the audit trail: the S17-5 state again, for the target step. The docstring of
``_persist_and_apply`` and /work/notes/s18-store.md say a target refusal gives the target the inverse
change; the code does not.

R18-4: a change the target refuses (502 ``target_refused``) now runs the journal's roll-back
(``ChangeFiles.roll_back`` -> ``restore`` -> ``_needed(active_files(active_dir, before))``), which makes the
WHOLE active directory equal to the store's in-memory set: a ``*.rego`` or ``data/*.json`` file the operator
placed in ``policy.dir`` since the start (loaded at the next start, docs/policy.md) is deleted, and a data
file whose value differs is rewritten in canonical JSON. Before session 18 a refusal only discarded the
staged files. The refused change touched one file; the roll-back should touch only what the change staged.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from policy.loader import PolicySet
from policy.store import PolicyStore, PolicyTargetError
from policy.store_types import ChangeRecord

EXTRA = "package extra.a\n\nx := 1\n"
TIERS = "prefixgate/config/tiers"


class LossyOpa:
    """A target like a remote OPA: it holds what it was sent. ``lose`` = ``"reply"``: the next change is
    applied and then its reply is lost (PolicyTargetError, as RemoteOpaTarget maps a client error);
    ``"cancel"``: applied, then the admin request is cancelled before the reply is read."""

    def __init__(self, initial: PolicySet) -> None:
        self.modules = dict(initial.modules)
        self.data = dict(initial.data_docs)
        self.lose: str | None = None

    async def apply(self, change: ChangeRecord, policy_set: PolicySet) -> None:
        if change.kind == "policy":
            if change.op == "put":
                self.modules[change.target] = policy_set.modules[change.target]
            else:
                self.modules.pop(change.target, None)
        elif change.op == "put":
            self.data[change.target] = policy_set.data_docs[change.target]
        else:
            self.data.pop(change.target, None)
        lose, self.lose = self.lose, None
        if lose == "reply":
            raise PolicyTargetError("remote OPA refused the change: ReadTimeout")
        if lose == "cancel":
            raise asyncio.CancelledError()


@pytest.mark.parametrize("lose", ["reply", "cancel"])
async def test_a_change_the_target_took_but_did_not_confirm_is_taken_back(
        active: Path, tmp_path: Path, lose: str) -> None:
    store = PolicyStore(active, tmp_path / "versions")
    opa = LossyOpa(store.policy_set)
    store = PolicyStore(active, tmp_path / "versions", target=opa)
    audit: list[ChangeRecord] = []
    store.add_change_listener(audit.append)
    opa.lose = lose
    with pytest.raises((PolicyTargetError, asyncio.CancelledError)):
        await store.put_policy("extra_a.rego", EXTRA, "ops")
    # the store says: refused, nothing in force, nothing audited, nothing on disk
    assert store.version == 0 and "extra_a.rego" not in store.policy_set.modules and audit == []
    assert not (active / "extra_a.rego").exists()
    # the next change (another document) goes through; the target must now hold exactly the store's set
    tiers = store.get_data(TIERS)
    tiers["standard"] = {"max_tokens": 7}
    rec = await store.put_data(TIERS, tiers, "ops")
    assert rec.version == 1 and audit == [rec]
    assert opa.data[TIERS] == tiers
    assert "extra_a.rego" not in opa.modules, "the target still decides with the change answered 502"


class RefusingOpa:
    """A target that refuses every change (as RemoteOpaTarget maps an OPA 400/500)."""

    async def apply(self, change: ChangeRecord, policy_set: PolicySet) -> None:
        raise PolicyTargetError("remote OPA refused the change: HTTPStatusError")


async def test_a_refused_change_leaves_the_operators_other_files_alone(active: Path, tmp_path: Path) -> None:
    store = PolicyStore(active, tmp_path / "versions", target=RefusingOpa())
    mine = active / "operator_added.rego"
    mine.write_text("package operator.added\n\ny := 2\n", "utf-8")  # for the next start
    with pytest.raises(PolicyTargetError):
        await store.put_policy("extra_a.rego", EXTRA, "ops")
    assert not (active / "extra_a.rego").exists() and store.version == 0
    assert mine.exists(), "the refused change's roll-back deleted a file it never touched"
