"""Session 17, helper attack (S17-7): a policy or data upload compiles the whole set, runs every Rego
test and builds the new engine on the gateway's event loop (policy/store.py ``_commit`` calls
``run_tests`` synchronously; ``EmbeddedOpa.load`` builds synchronously; ``adopt`` does the same on every
other instance). Measured live (two instances, shipped policy, /work/notes/s17-attack/policy_stall.py):
the upload took 1.2 s and every tenant's request on both instances waited up to 1.3-1.6 s behind it
(p50 ~25 ms before). The assertion is on where the work runs, not on time."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

import policy.store
from policy.embedded import EmbeddedOpa
from policy.store import PolicyStore

TIERS = "prefixgate/config/tiers"


async def test_the_upload_work_runs_off_the_event_loop(active: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    loop_thread = threading.current_thread()
    seen: list[threading.Thread] = []
    real = policy.store.run_tests

    def spy(*args, **kwargs):
        seen.append(threading.current_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(policy.store, "run_tests", spy)
    opa = EmbeddedOpa(active, timeout_s=5.0)
    try:
        store = PolicyStore(active, tmp_path / "versions", target=opa)
        tiers = store.get_data(TIERS)
        tiers["t-x"] = {"max_tokens": 9}
        await store.put_data(TIERS, tiers, "ops")
        assert seen and all(t is not loop_thread for t in seen)
    finally:
        opa.close()
