"""Session 24, S23-fixreg-3: after a tenants reload answered 409 ``conflict``, the instance adopts the stored
registry at once; a Redis error there is now logged (WARNING naming the document and the error class) instead
of suppressed without a word. The answer stays 409 (the next poll adopts the stored registry).
"""
from __future__ import annotations

import logging
from typing import Any

from gateway.shared_state import SharedState


class _Doc:
    name = "tenants"

    async def publish(self, version: int, body: Any) -> bool:
        return False  # refused: another instance stored this version first

    async def sync(self) -> bool:
        raise ConnectionError("Redis went away")


class _State:
    async def _refused(self, doc: Any, version: int, what: str) -> tuple[str, str]:
        return "conflict", f"{doc.name} version {version} was stored by another instance first"


async def test_a_failed_adoption_after_a_refused_reload_is_logged(caplog: Any) -> None:
    with caplog.at_level(logging.WARNING, logger="prefixgate.state"):
        answer = await SharedState._publish_doc(_State(), _Doc(), 3, {"tenants": []})  # type: ignore[arg-type]
    assert answer is not None and answer[:2] == (409, "conflict")
    assert "adopting the stored tenants failed (ConnectionError)" in caplog.text
