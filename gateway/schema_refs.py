"""The size of a JSON schema once its local ``$ref`` are inlined (session 25, S25-review-5), for the bounds of
gateway/response_format.py.

A grammar compiler that turns a schema into one regular expression inlines each reference by its target
(outlines-core's ``build_regex_from_schema`` resolves every ``$ref`` and builds its target's expression in
place), so references multiply: 20 definitions each referring to the next twice are ~1.3 KB of JSON, 3 schema
levels deep, and 2**20 copies of the last one once inlined. A compiler that keeps references as grammar rules
(xgrammar) does not multiply them; the gateway cannot tell which the replica runs, so it counts the inlined size
(fail closed) against ``limits.json_schema.max_bytes``.

Counted, never built: each definition's own compact JSON bytes (one encoding each) plus, for each reference it
holds, its target's inlined count (memoized, so the work is O(nodes + references)). A reference back into a
definition still being counted (recursion, which every compiler bounds or keeps as a rule) adds nothing more.
Local references only: ``#/$defs/<name>`` and ``#/definitions/<name>`` of the schema's own top level (RFC 6901
escapes ``~1`` ``/`` and ``~0`` ``~``), a pointer below a definition counting as the whole definition (an upper
bound). Anything else (a remote or unresolvable reference) is left to the replica, which refuses it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["inlined_bytes"]

_MAPS = ("$defs", "definitions")


def inlined_bytes(schema: Any, size_of: Callable[[Any], int], cap: int) -> int:
    """Compact JSON bytes of ``schema`` with its local references inlined (module docstring), at most ``cap + 1``.

    ``size_of``: a value's compact JSON bytes (a C encoding); it is called once for ``schema`` and once per
    definition that a reference reaches. 0 for a schema without a top-level ``$defs``/``definitions`` object or
    without a local reference (nothing to inline: the caller's byte bound holds). Work: one pass over the schema
    (each node once) and one step per definition reached. Raises nothing beyond ``size_of``'s errors."""
    if type(schema) is not dict:
        return 0
    defs: dict[tuple[str, str], Any] = {}
    for key in _MAPS:
        if type(found := schema.get(key)) is dict:
            defs.update(((key, name), sub) for name, sub in found.items())
    if not defs:
        return 0
    refs_of = _references(schema, defs)
    top = refs_of.pop(None, None)
    if not top:
        return 0
    counted: dict[Any, int] = {}
    total = size_of(schema)
    for target in top:
        total += _inlined(target, defs, refs_of, counted, size_of, cap)
        if total > cap:
            return cap + 1
    return total


def _inlined(start: tuple[str, str], defs: dict[tuple[str, str], Any], refs_of: dict[Any, list[Any]],
             counted: dict[Any, int], size_of: Callable[[Any], int], cap: int) -> int:
    """Inlined bytes of definition ``start`` (capped at ``cap + 1``), counting unvisited definitions depth first
    without recursion; a definition on the current path counts 0 (recursion)."""
    on_path: set[Any] = set()
    stack: list[tuple[Any, bool]] = [(start, False)]
    while stack:
        key, expanded = stack[-1]
        if key in counted:
            stack.pop()
        elif not expanded:  # first visit: count its references first
            stack[-1] = (key, True)
            on_path.add(key)
            stack.extend((r, False) for r in refs_of.get(key, ()) if r not in counted and r not in on_path)
        else:
            total = size_of(defs[key])
            for r in refs_of.get(key, ()):
                total += counted.get(r, 0)  # on the path: 0 (recursion)
            counted[key] = total if total <= cap else cap + 1
            on_path.discard(key)
            stack.pop()
    return counted[start]


def _references(schema: dict[str, Any], defs: dict[tuple[str, str], Any]) -> dict[Any, list[Any]]:
    """``{owner: [referred definition, ...]}`` in one pass: ``owner`` is the top-level definition holding the
    ``$ref`` (None outside the definitions maps), one entry per occurrence."""
    out: dict[Any, list[Any]] = {}
    pending: list[tuple[Any, Any]] = [(sub, key) for key, sub in defs.items()]
    pending += [(v, None) for k, v in schema.items() if k not in _MAPS]
    if type(ref := schema.get("$ref")) is str and (target := _target(ref)) in defs:
        out[None] = [target]
    while pending:
        cur, owner = pending.pop()
        if type(cur) is list:
            pending.extend((v, owner) for v in cur if type(v) is dict or type(v) is list)
        elif type(cur) is dict:
            if type(ref := cur.get("$ref")) is str and (target := _target(ref)) in defs:
                out.setdefault(owner, []).append(target)
            pending.extend((v, owner) for v in cur.values() if type(v) is dict or type(v) is list)
    return out


def _target(ref: str) -> tuple[str, str] | None:
    """``("$defs", name)`` / ``("definitions", name)`` of a local reference (a pointer below a definition reads as
    the definition), else None."""
    if not ref.startswith("#/"):
        return None
    where, _, rest = ref[2:].partition("/")
    name = rest.partition("/")[0]
    return (where, name.replace("~1", "/").replace("~0", "~") if "~" in name else name) if where in _MAPS else None
