"""The ``policy`` config section of a gateway with a policy store (operator policy and data routes).

``{"policy": policy_store_section(tmp_path)}`` as a test's ``config_overrides``: the embedded engine
on a copy of the shipped ``rego/`` at ``tmp_path/rego-active`` (the store writes there, never into
the repository) with its versions under ``tmp_path/versions``.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

__all__ = ["policy_store_section"]

REPO = Path(__file__).resolve().parents[2]


def policy_store_section(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    """The section (a new dict; ``extra`` keys added, e.g. ``allowed_builtins``) after copying
    ``rego/`` to ``tmp_path/rego-active``. Raises FileExistsError when that folder exists."""
    active = tmp_path / "rego-active"
    shutil.copytree(REPO / "rego", active)
    return {"mode": "embedded", "dir": str(active), "versions_dir": str(tmp_path / "versions"), **extra}
