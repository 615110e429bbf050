"""Session 17, helper attack (S17-5): a policy upload whose version cannot be written.

``PolicyStore._commit`` (policy/store.py) applies the candidate set to the target (the embedded
engine swaps it in, the decision cache is cleared) *before* it writes the version directory and the
active file. When that write fails (a full or read-only ``versions_dir``: an operator's mistake) the
upload raises, the admin API answers an error (no 200) and no change listener runs (no audit record's
``on_change`` for it, nothing published to the other instances), yet the engine decides with the new
set. The store still holds the old set: the next upload is compiled and tested on the old set and,
once applied, silently drops the unacknowledged change again; a restart loads what the disk holds.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from policy.embedded import EmbeddedOpa
from policy.store import PolicyStore

TIERS = "prefixgate/config/tiers"


async def test_a_refused_upload_leaves_engine_and_store_alone(active: Path, tmp_path: Path) -> None:
    """What holds: a set that fails its Rego tests changes nothing anywhere."""
    opa = EmbeddedOpa(active, timeout_s=5.0)
    try:
        store = PolicyStore(active, tmp_path / "versions", target=opa)
        with pytest.raises(Exception):
            await store.put_policy("authz.rego", "package prefixgate.authz\ndecision := {", "ops")
        assert opa.policy_set.modules == store.policy_set.modules
    finally:
        opa.close()


async def test_an_upload_that_cannot_be_persisted_is_not_in_force(active: Path, tmp_path: Path) -> None:
    opa = EmbeddedOpa(active, timeout_s=5.0)
    try:
        versions = tmp_path / "versions"
        store = PolicyStore(active, versions, target=opa)
        (versions / "00000001").write_text("in the way")  # the version directory cannot be made
        records: list = []
        store.add_change_listener(records.append)
        tiers = store.get_data(TIERS)
        tiers["standard"] = {"max_tokens": 7}
        with pytest.raises(OSError):
            await store.put_data(TIERS, tiers, "ops")
        assert records == []  # not acknowledged, not published, not audited as a change
        assert store.get_data(TIERS)["standard"] == {"max_tokens": 1024}
        # the engine must decide with what the store holds (the old set)
        assert opa.policy_set.data_docs[TIERS]["standard"] == {"max_tokens": 1024}
    finally:
        opa.close()
