"""Print the CPython interpreter ``make setup`` builds ``.venv`` from (issue 14, session 19).

The interpreter's own build is part of the gateway's per-request cost. A distribution's CPython
(Debian and Ubuntu ``/usr/bin/python3``, Fedora's, the official ``python`` Docker images) is
compiled with profile-guided optimisation and link-time optimisation and its executable links
the interpreter statically; a plain ``./configure && make`` (pyenv's default, which also adds
``--enable-shared``) has neither. On the 2-core CI machine a Python micro-benchmark ran 25 % slower and
the gateway used 8-17 % more CPU per request on pyenv's 3.11.7 than on Debian's 3.11.2
(docs/benchmarks.md, "End of the 2026-12-03 session 19"). CPython's own
build guide names the flags: ``--enable-optimizations`` (PGO) and ``--with-lto``
(https://docs.python.org/3/using/configure.html#performance-options).

Rule (first match wins; no timing, so the same machine always gets the same answer):

1. ``$PREFIXGATE_PYTHON`` when set (an operator's explicit choice: when it does not qualify the script
   says so on stderr and exits 1, never falls back silently);
2. the distribution's interpreter, ``/usr/bin/python3``;
3. ``python3`` on ``PATH``.

A candidate is taken only when it is CPython >= 3.11 and can create a virtual environment with
pip (``venv`` and ``ensurepip`` import). Prints the chosen path on stdout and exits 0; prints
nothing and exits 1 when no candidate qualifies (the Makefile then falls back to ``python3``, whose
own error says what is missing).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence

__all__ = ["candidates", "pick", "qualifies"]

DISTRIBUTION_PYTHON = "/usr/bin/python3"
MIN_VERSION = (3, 11)
_PROBE = (
    "import sys, venv, ensurepip, platform; "
    "print(platform.python_implementation() == 'CPython' and sys.version_info >= %r)" % (MIN_VERSION,)
)


def candidates(env: dict[str, str], which: Callable[[str], str | None] = shutil.which) -> list[str]:
    """The interpreters to try, best first: ``$PREFIXGATE_PYTHON``, ``/usr/bin/python3``,
    ``python3`` on ``PATH`` (paths; duplicates and missing ones left out)."""
    out: list[str] = []
    for path in (env.get("PREFIXGATE_PYTHON"), DISTRIBUTION_PYTHON, which("python3")):
        if path and path not in out and os.path.exists(path):
            out.append(path)
    return out


def qualifies(path: str, timeout_s: float = 20.0) -> bool:
    """True when ``path`` runs, is CPython >= 3.11 and has ``venv`` and ``ensurepip``."""
    try:
        done = subprocess.run([path, "-c", _PROBE], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0 and done.stdout.strip() == "True"


def pick(paths: Sequence[str], ok: Callable[[str], bool] = qualifies) -> str | None:
    """The first of ``paths`` that ``ok`` accepts, or None."""
    return next((p for p in paths if ok(p)), None)


def main() -> int:
    own = os.environ.get("PREFIXGATE_PYTHON")
    if own and not (os.path.exists(own) and qualifies(own)):  # an explicit choice is never replaced silently
        print(f"PREFIXGATE_PYTHON={own}: not a CPython >= 3.11 with venv and ensurepip", file=sys.stderr)
        return 1
    chosen = pick(candidates(dict(os.environ)))
    if chosen is None:
        return 1
    print(chosen)
    return 0


if __name__ == "__main__":
    sys.exit(main())
