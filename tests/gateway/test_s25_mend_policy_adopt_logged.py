"""Session 25 (mend, S24-fixreg-2): after a policy change answered 409 ``conflict`` (another instance stored
that version first), the instance adopts the stored set in a task; when that adoption fails (a Redis error)
a WARNING names the document and the exception class, never policy text. Before: the task's exception was
dropped without a word (the same shape as S23-fixreg-3 for the tenant registry,
tests/gateway/test_s24_fixreg_reload_adopt_logged.py)."""
from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

import policy.store_disk
from gateway.shared_state import SharedState
from tests.gateway.test_s24_fixreg_reload_adopt_logged import _Doc
from tests.gateway.test_s24_fixreg_reload_adopt_logged import _State as _TenantsState

SECRET_RULE = "allow if input.tenant == \"secret-tenant-name\""


class _PolicyDoc(_Doc):
    """The stored policy set: its publish refused, its adoption failing with a Redis error."""

    name = "policy"


class _State:
    """The parts of a :class:`SharedState` ``_publish_policy`` uses; the spawned task runs as in the gateway."""

    _spawn = SharedState._spawn
    settle = SharedState.settle

    def __init__(self) -> None:
        self.policy = _PolicyDoc()
        self._pending: set[Any] = set()

    _refused = _TenantsState._refused  # answers "conflict"


async def test_a_failed_adoption_after_a_refused_policy_change_is_logged(caplog: Any,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy.store_disk, "policy_set_document", lambda policy_set: {"rego": SECRET_RULE})
    state = _State()
    with caplog.at_level(logging.WARNING, logger="prefixgate.state"):
        shared = await SharedState._publish_policy(state, SimpleNamespace(version=7), object())  # type: ignore[arg-type]
        assert shared == "conflict"  # the request answers 409 whatever the adoption does
        await state.settle()  # the adoption task has ended
    assert "adopting the stored policy failed (ConnectionError): the next poll does" in caplog.text
    assert SECRET_RULE not in caplog.text and "secret-tenant-name" not in caplog.text
