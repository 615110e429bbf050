"""Session 17, helper attack: concurrent policy uploads to one gateway (policy/store.py).

What held: with the embedded engine two concurrent uploads are applied one after the other and both
are in the active set (the commit never yields the event loop between reading the set and swapping it).

S17-4: with a remote OPA (``RemoteOpaTarget``, whose ``apply`` awaits the network) ``put_policy`` /
``put_data`` build the candidate set from ``self._set`` *before* taking the store's lock: the second of
two concurrent uploads is validated and committed on a set without the first. Both answer 200; OPA holds
both modules (each push sends one module), the store's active directory holds both files, but the
store's set (``GET /admin/policies``, the base every later change is compiled and Rego-tested on) lacks the
first: what was tested is not what runs, and a restart runs something else again.
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any


from policy.embedded import EmbeddedOpa
from policy.remote import RemoteOpa
from policy.store import PolicyStore, RemoteOpaTarget

MOD_A = ("extra_a.rego", "package extra.a\n\nx := 1\n")
MOD_B = ("extra_b.rego", "package extra.b\n\ny := 2\n")


async def test_concurrent_uploads_embedded_both_kept(active: Path, tmp_path: Path) -> None:
    opa = EmbeddedOpa(active, timeout_s=5.0)
    try:
        store = PolicyStore(active, tmp_path / "versions", target=opa)
        await asyncio.gather(store.put_policy(*MOD_A, "ops-1"), store.put_policy(*MOD_B, "ops-2"))
        ids = {p["id"] for p in store.list_policies()}
        assert {MOD_A[0], MOD_B[0]} <= ids
        assert {MOD_A[0], MOD_B[0]} <= set(opa.policy_set.modules)
    finally:
        opa.close()


async def test_concurrent_uploads_remote_both_kept(active: Path, tmp_path: Path, fresh_opa_server: Any) -> None:
    server, state = fresh_opa_server
    async with RemoteOpa(server.url, timeout_s=5.0) as remote:
        store = PolicyStore(active, tmp_path / "versions", target=RemoteOpaTarget(remote.client, remote.notify_change))
        ra, rb = await asyncio.gather(store.put_policy(*MOD_A, "ops-1"), store.put_policy(*MOD_B, "ops-2"))
        assert {ra.version, rb.version} == {1, 2}
        assert {MOD_A[0], MOD_B[0]} <= set(state.modules)  # OPA runs both
        restarted = PolicyStore(active, tmp_path / "versions")
        assert {MOD_A[0], MOD_B[0]} <= set(restarted.policy_set.modules)  # the disk holds both
        # the store's own set (what the next change is tested on, what GET /admin/policies lists)
        assert {MOD_A[0], MOD_B[0]} <= {p["id"] for p in store.list_policies()}
