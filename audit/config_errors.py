"""Config validation errors as the user's dotted keys: one helper for every config loader.

:func:`pydantic_problem` turns one pydantic error into ``dotted.key: message``. It lives in
``audit`` because both loaders may import it from here: the gateway's (``gateway.config``,
which already imports ``audit.config_schema``) and the audit section's own
(``audit.config_schema``, used by audit tools without a gateway); ``audit`` never imports
``gateway`` (docs/architecture.md, "Dependencies point one way").
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["key_path", "pydantic_problem"]

_PREFIXES = ("Value error, ", "Assertion failed, ")


def key_path(loc: Sequence[Any], data: Any) -> list[Any]:
    """The error location ``loc`` (pydantic's tuple of keys and list indices) as the user's
    keys in ``data``: a part pydantic adds that is no key of the input (the tag of a
    discriminated union, e.g. ``cache_aware`` in ``routing.policy.cache_aware.prefix_weight``)
    is left out when the next part is a key there. Parts of values not in ``data`` (set from
    the environment) are kept as they are. Never raises."""
    out: list[Any] = []
    node = data
    i = 0
    while i < len(loc):
        part = loc[i]
        if isinstance(node, Mapping):
            if part not in node and i + 1 < len(loc) and loc[i + 1] in node:
                i += 1  # a tag: skip it
                continue
            node = node.get(part)
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            node = None
        out.append(part)
        i += 1
    return out


def pydantic_problem(err: Mapping[str, Any], data: Any, prefix: str = "") -> str:
    """One pydantic error (an item of ``ValidationError.errors()``) over the input ``data`` as
    ``<prefix>.<dotted.key>: <message>``: a key no schema knows reads ``unknown field`` (as
    docs/configuration.md promises), pydantic's ``Value error, `` / ``Assertion failed, ``
    prefixes are dropped, and a rule with no key of its own (and no ``prefix``) is just its
    message. Never raises."""
    msg = str(err["msg"])
    for p in _PREFIXES:
        msg = msg.removeprefix(p)
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    path = ".".join([prefix] * bool(prefix) + [str(p) for p in key_path(err["loc"], data)])
    return f"{path}: {msg}" if path else msg
