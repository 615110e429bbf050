"""Start PrefixGate's own Python processes without the working directory on ``sys.path`` (R12-4).

``python -m pkg.mod`` puts the current directory first on ``sys.path``, ahead of
site-packages: a directory there named like one of PrefixGate's packages
(``audit``, ``gateway``, ``policy``, ...) would be imported instead, as the
gateway's user, and ``init``'s config directory holds such a directory (``audit/``,
the log folder), which used to break every restart started from inside it.
``-P`` (Python >= 3.11, the project's floor) and ``PYTHONSAFEPATH=1`` stop that
prepend (https://docs.python.org/3/using/cmdline.html#cmdoption-P); the
environment variable also reaches the children's own children.

The child must still import the *same* PrefixGate as this process: unless that
came from site-packages (a wheel install, on every child's path anyway), the
directory it came from (a source checkout run as ``python -m gateway.cli``, an
editable install's tree, a test tree) goes first on ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import site
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["PROJECT_ROOT", "child_env", "python_module_argv"]

#: the directory holding this process's ``gateway`` package (site-packages, or a checkout)
PROJECT_ROOT = str(Path(__file__).resolve().parents[1])


def python_module_argv(module: str, *args: str) -> list[str]:
    """``[sys.executable, "-P", "-m", module, *args]``: this interpreter, no cwd on ``sys.path``."""
    return [sys.executable, "-P", "-m", module, *args]


def _is_site_dir(root: str) -> bool:
    """True when ``root`` is one of this interpreter's site-packages directories (a wheel
    install), which every child has on ``sys.path`` anyway, after the standard library."""
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return any(os.path.realpath(d) == root for d in dirs)


def child_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of ``base`` (default ``os.environ``) with ``PYTHONSAFEPATH=1`` and, unless it is a
    site-packages directory (see the module docstring), :data:`PROJECT_ROOT` first on ``PYTHONPATH``."""
    env = dict(os.environ if base is None else base)
    env["PYTHONSAFEPATH"] = "1"
    if not _is_site_dir(PROJECT_ROOT):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (PROJECT_ROOT, env.get("PYTHONPATH", "")) if p)
    return env
