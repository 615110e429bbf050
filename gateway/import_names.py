"""Refuse to serve when another installed distribution owns one of PrefixGate's import names (R5-9).

The wheel installs seven top-level packages with generic names
(:data:`OUR_PACKAGES`); PyPI has projects owning some of them (``policy``,
``routing``). Installed into one environment, the two overwrite each other's
files and either may be imported: for the policy engine wrapper and the
shipped Rego directory that is a silent security fault. :func:`foreign_owners`
reads the installed distributions' metadata
(:func:`importlib.metadata.packages_distributions`: ``top_level.txt`` or
``RECORD``) and :func:`collision_message` turns a collision into the error
``prefixgate serve`` exits with. The remedy is PrefixGate in its own virtual
environment (README "Put PrefixGate in front of your replicas").
"""

from __future__ import annotations

import importlib.metadata
import re

__all__ = ["OUR_PACKAGES", "collision_message", "foreign_owners"]

#: the wheel's top-level packages (pyproject.toml ``tool.setuptools.packages.find``)
OUR_PACKAGES = ("audit", "gateway", "policy", "rego", "routing", "sim", "tenancy")
#: our distribution's name, normalized (PEP 503)
_OURS = "prefixgate"


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def foreign_owners() -> dict[str, list[str]]:
    """``{import name: [other distribution names, sorted]}`` for each of :data:`OUR_PACKAGES` that
    an installed distribution other than ``prefixgate`` also provides (empty: no collision).
    Reads the metadata of every distribution on ``sys.path`` now (~0.1 s for ~100 distributions);
    never raises for unreadable metadata (such a distribution is skipped by importlib)."""
    owners = importlib.metadata.packages_distributions()
    found: dict[str, list[str]] = {}
    for name in OUR_PACKAGES:
        others = sorted({d for d in owners.get(name, []) if _normalized(d) != _OURS})
        if others:
            found[name] = others
    return found


def collision_message() -> str | None:
    """The error text for :func:`foreign_owners`' collisions, None when there is none."""
    found = foreign_owners()
    if not found:
        return None
    names = ", ".join(f"'{pkg}' (also installed by {', '.join(dists)})" for pkg, dists in found.items())
    return (f"import name collision: {names}. PrefixGate's top-level packages share these names with "
            "another installed distribution, whose files and PrefixGate's overwrite each other; install "
            "PrefixGate into its own virtual environment (README, 'Put PrefixGate in front of your replicas')")
