"""Issue 14: request ids stay 32 random lowercase hex characters, made without a UUID object."""

from __future__ import annotations

import re
import uuid

import pytest

from gateway.record import new_request_id


def test_ids_are_32_hex_and_distinct(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uuid, "uuid4", lambda: (_ for _ in ()).throw(AssertionError("uuid4 per request")))
    ids = [new_request_id() for _ in range(10000)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)
