"""Routing-policy authorization: the PDP interface, embedded and remote OPA,
decision cache, policy management (see docs/policy.md)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

__all__ = ["GO_GC_PERCENT", "reexec_with_go_gc"]

#: ``GOGC`` for the embedded OPA Go runtime. Go's default (100) makes the
#: embedded decision's p99 ~1 ms on a 2-core machine; 800 brought it to
#: ~0.33 ms for a few more MB of Go heap (docs/policy.md, "Latency").
GO_GC_PERCENT = "800"


def reexec_with_go_gc(argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
    """Re-exec this process with ``GOGC`` set, unless the operator set it already.

    The embedded engine is a Go c-shared library: its runtime reads ``GOGC``
    from the environment the *process started with* (``putenv`` after start is
    not seen), so a process entry point (``prefixgate serve``,
    ``python -m bench.policy_decisions``) calls this first. ``argv`` is the argument list
    to re-run (``sys.argv``-like, without the interpreter, e.g. ``["-P", "-m", ...]``);
    ``env`` the new process's environment (default ``os.environ``), ``GOGC`` added.
    Returns only when nothing needs to change; otherwise never returns (``os.execve``).
    """
    if "GOGC" in os.environ:
        return
    new_env = dict(os.environ if env is None else env)
    new_env["GOGC"] = GO_GC_PERCENT
    os.execve(sys.executable, [sys.executable, *argv], new_env)
