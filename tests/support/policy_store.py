"""The ``policy`` config section of a gateway with a policy store (operator policy and data routes).

``{"policy": policy_store_section(tmp_path)}`` as a test's ``config_overrides``: the embedded engine
on a copy of the shipped ``rego/`` at ``tmp_path/rego-active`` (the store writes there, never into
the repository) with its versions under ``tmp_path/versions``. :func:`header_identity`: the
``authorize`` of ``policy.admin.admin_routes`` in tests that mount the routes on their own app.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request

__all__ = ["header_identity", "policy_store_section"]

REPO = Path(__file__).resolve().parents[2]


def policy_store_section(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    """The section (a new dict; ``extra`` keys added, e.g. ``allowed_builtins``) after copying
    ``rego/`` to ``tmp_path/rego-active``. Raises FileExistsError when that folder exists."""
    active = tmp_path / "rego-active"
    shutil.copytree(REPO / "rego", active)
    return {"mode": "embedded", "dir": str(active), "versions_dir": str(tmp_path / "versions"), **extra}


async def header_identity(request: Request) -> dict[str, str]:
    """A test ``authorize`` for ``policy.admin.admin_routes``: the caller is the SPIFFE ID in the
    ``x-test-spiffe-id`` header (``client_address`` 10.0.0.9); no header: 401 (HTTPException)."""
    who = request.headers.get("x-test-spiffe-id")
    if who is None:
        raise HTTPException(401, "no identity")
    return {"spiffe_id": who, "client_address": "10.0.0.9"}
