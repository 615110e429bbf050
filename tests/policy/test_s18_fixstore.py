"""Session 18, helper fixstore: the fixes of R18-1 (a change the target took but did not confirm is given
back) and R18-4 (a roll-back touches only the paths the change staged), beyond the review's own tests
(tests/policy/test_s18_review_store.py)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from opa_client.errors import DeleteDataError, DeletePolicyError

import policy.store_disk
from policy.loader import JOURNAL, PolicySet, load_policy_dir
from policy.store import PolicyStore, PolicyTargetError, RemoteOpaTarget
from policy.store_types import ChangeRecord

EXTRA = "package extra.a\n\nx := 1\n"
MINE = "package operator.added\n\ny := 2\n"


class Crash(BaseException):
    """The process dies here."""


class DeletingClient:
    """An AsyncOpaClient stand-in whose deletes fail with ``code`` (as opa-python-client raises an OPA error)."""

    def __init__(self, code: str) -> None:
        self.code = code
        self.calls: list[str] = []

    async def delete_policy(self, name: str) -> bool:
        self.calls.append(name)
        raise DeletePolicyError(self.code, "storage_not_found_error: policy id " + name)

    async def delete_data(self, name: str) -> bool:
        self.calls.append(name)
        raise DeleteDataError(self.code, "document missing")


def _delete(kind: str, target: str) -> ChangeRecord:
    return ChangeRecord(version=2, who="ops", kind=kind, op="delete", target=target,  # type: ignore[arg-type]
                        old_sha256="x", new_sha256=None, time=0.0)


@pytest.mark.parametrize("kind", ["policy", "data"])
async def test_deleting_what_a_remote_opa_does_not_hold_is_done(kind: str) -> None:
    """R18-1: the undo of a put of a NEW module is a delete; an OPA that truly refused the put answers 404."""
    client = DeletingClient("resource_not_found")
    await RemoteOpaTarget(client).apply(_delete(kind, "extra_a.rego" if kind == "policy" else "a/b"),  # type: ignore[arg-type]
                                        PolicySet({}, {}))
    assert len(client.calls) == 1


async def test_any_other_delete_error_is_still_a_refusal() -> None:
    client = DeletingClient("internal_error")
    with pytest.raises(PolicyTargetError) as err:
        await RemoteOpaTarget(client).apply(_delete("policy", "extra_a.rego"), PolicySet({}, {}))  # type: ignore[arg-type]
    assert not err.value.target_may_hold_change


class FailingOpa:
    """Refuses every change after it was applied (a lost reply); counts what it was sent."""

    def __init__(self) -> None:
        self.sent: list[ChangeRecord] = []
        self.fail = True

    async def apply(self, change: ChangeRecord, policy_set: PolicySet) -> None:
        self.sent.append(change)
        if self.fail:
            self.fail = False
            raise PolicyTargetError("remote OPA refused the change: ReadTimeout")


async def test_a_lost_reply_says_the_target_may_hold_the_change(active: Path, tmp_path: Path) -> None:
    opa = FailingOpa()
    store = PolicyStore(active, tmp_path / "versions", target=opa)
    with pytest.raises(PolicyTargetError) as err:
        await store.put_policy("extra_a.rego", EXTRA, "ops")
    assert err.value.target_may_hold_change and "re-applied" in str(err.value)
    rec = await store.put_policy("extra_b.rego", "package extra.b\n\nz := 3\n", "ops")
    # the next change first gave the target the inverse of the unconfirmed one (a delete of the new module)
    assert [(c.op, c.target) for c in opa.sent] == [("put", "extra_a.rego"), ("delete", "extra_a.rego"),
                                                    ("put", "extra_b.rego")]
    assert rec.version == 1


def _crash_at_rename(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    def wrap(real: Any) -> Any:
        def renamed(src: Any, dst: Any) -> None:
            real(src, dst)
            if Path(dst).name == name:
                raise Crash(str(dst))
        return renamed
    monkeypatch.setattr(policy.store_disk.os, "replace", wrap(os.replace))


async def test_a_crash_time_restore_leaves_the_operators_other_files_alone(
        active: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """R18-4: the active file is renamed in place, the process dies; the restart rolls the change back and
    leaves a file the operator added (and one the operator formatted) as they are."""
    versions = tmp_path / "versions"
    store = PolicyStore(active, versions)
    before = store.policy_set
    mine = active / "operator_added.rego"
    mine.write_text(MINE, "utf-8")
    _crash_at_rename(monkeypatch, "extra_a.rego")
    with pytest.raises(Crash):
        await store.put_policy("extra_a.rego", EXTRA, "ops")
    monkeypatch.undo()
    doc = json.loads((active / JOURNAL / "undo.json").read_text("utf-8"))
    assert doc["files"] == {"extra_a.rego": None}
    again = PolicyStore(active, versions)
    assert not (active / "extra_a.rego").exists() and mine.read_text("utf-8") == MINE
    assert again.policy_set == before.with_module("operator_added.rego", MINE) == load_policy_dir(active)


async def test_a_restore_puts_back_the_previous_text_of_a_replaced_file(active: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    versions = tmp_path / "versions"
    store = PolicyStore(active, versions)
    name = sorted(store.policy_set.modules)[0]
    edited = store.policy_set.modules[name] + "\n# the operator's comment, loaded at the next start\n"
    (active / name).write_text(edited, "utf-8")
    _crash_at_rename(monkeypatch, name)
    with pytest.raises(Crash):
        await store.put_policy(name, store.policy_set.modules[name] + "\n# the change\n", "ops")
    monkeypatch.undo()
    PolicyStore(active, versions)
    assert (active / name).read_text("utf-8") == edited


def test_an_old_format_journal_restores_the_whole_set(active: Path, tmp_path: Path) -> None:
    """A journal armed before the review fixes (no ``files``): the whole directory back to its set."""
    versions = tmp_path / "versions"
    store = PolicyStore(active, versions)
    (active / "extra_a.rego").write_text(EXTRA, "utf-8")  # what the uncommitted change renamed in place
    (active / JOURNAL).mkdir()
    (active / JOURNAL / "undo.json").write_text(json.dumps(
        {"record": {"version": 1}, "set": policy.store_disk.policy_set_document(store.policy_set)}), "utf-8")
    assert policy.store_disk.restore(active, versions) == {"version": 1}
    assert not (active / "extra_a.rego").exists() and not (active / JOURNAL).exists()


@pytest.mark.parametrize("files", [{"../outside.rego": None}, {"/etc/x.rego": None}, ["a.rego"], {"a.rego": 3}])
def test_a_journal_naming_a_path_outside_the_directory_is_refused(active: Path, tmp_path: Path, files: Any) -> None:
    versions = tmp_path / "versions"
    versions.mkdir()
    before = load_policy_dir(active)
    (active / JOURNAL).mkdir()
    (active / JOURNAL / "undo.json").write_text(json.dumps(
        {"record": {"version": 1}, "set": policy.store_disk.policy_set_document(before), "files": files}), "utf-8")
    with pytest.raises(ValueError, match="unreadable change journal"):
        policy.store_disk.restore(active, versions)
    assert (active / JOURNAL).exists()
