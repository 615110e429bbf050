"""The shipped routing-authorization policy, as package data.

This package holds no Python logic: it exists so that the Rego modules
(``*.rego``, ``*_test.rego``) and their operator data (``data/**.json``)
install with PrefixGate and are found through :mod:`importlib.resources`,
whatever the working directory. :func:`policy_dir` is the default of the
gateway's ``policy.dir``.
"""

from __future__ import annotations

from importlib.resources import as_file, files
from pathlib import Path

__all__ = ["policy_dir"]


def policy_dir() -> Path:
    """The directory of the installed shipped policy (a real file-system path).

    Layout as :mod:`policy.loader` reads it: ``authz.rego``,
    ``authz_test.rego``, ``data/prefixgate/config/*.json``. Raises
    :class:`FileNotFoundError` if the package was installed without its data
    (a broken build: ``tool.setuptools.package-data`` in pyproject.toml).
    """
    root = files(__name__)
    with as_file(root) as path:  # a plain directory for regular and editable installs
        found = Path(path)
    if not (found / "authz.rego").is_file():
        raise FileNotFoundError(f"the shipped policy is missing from {found} (package data not installed)")
    return found
