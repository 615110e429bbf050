"""The size of a JSON schema once its local ``$ref`` are inlined (session 25, S25-review-5; session 26, review26:
S26-review26-1, -2), for the bounds of gateway/response_format.py.

A grammar compiler that turns a schema into one regular expression inlines each reference by its target
(outlines-core's ``build_regex_from_schema`` resolves every ``$ref`` and builds its target's expression in
place), so references multiply: 20 definitions each referring to the next twice are ~1.3 KB of JSON, 3 schema
levels deep, and 2**20 copies of the last one once inlined. A compiler that keeps references as grammar rules
(xgrammar) does not multiply them; the gateway cannot tell which the replica runs, so it counts the inlined size
(fail closed) against ``limits.json_schema.max_bytes``.

Which references are local (session 26, S26-review26-1): any the replica's compiler may resolve inside the schema.
outlines-core (src/json_schema/parsing.rs ``parse_ref``) takes the text after ``#`` (or the whole reference when
it has no ``#``; a base before ``#`` only when it is the root's ``$id``), splits it on ``/``, drops empty parts and
looks each part up as an object key: so ``#/properties/a``, ``$defs/a``, ``#$defs/a`` and ``#//$defs/a`` all
resolve, not only ``#/$defs/<name>``. Here a part is looked up as written, else with RFC 6901's ``~1``/``~0``
escapes and then its percent-escapes decoded (RFC 6901 section 6), a list by its decimal index; a pointer whose
tail does not resolve counts as the deepest node it reaches (an upper bound), one whose first part does not
resolve is not local (the replica refuses it).

Counted, never built: the root's compact JSON bytes, and for each reference reached its target's inlined count.
A referenced node inside the part of the schema that is sent (the root outside its top-level ``$defs`` /
``definitions``) brings the expansion of the references it holds into its container's count. References that
form a cycle (recursion, which every inlining compiler unrolls to a bounded depth, e.g. outlines-core's 3) count
the cycle's nodes once each plus each reference inside the cycle once more as its target's bytes: the same
figure from wherever the cycle is entered (session 26, S26-review26-2: a count memoized while a cycle was half
counted undercounted each later entry to it, in an order the client chose). Since session 27 (S27-review27-1) a
schema with a cycle also counts as unrolled the way outlines-core unrolls it (:data:`REF_LEVELS` nested references
expanded, the next dropped), the larger figure: a cycle with fan-out ``k`` builds ``k**4`` copies there, and the
count of its nodes once each let a 140-byte schema through that outlines-core turns into a 6.9 MB regular
expression. Work: O(nodes + reference text), one C encoding per node reached, and for a cycle
``REF_LEVELS + 1`` more passes over the nodes reached.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar
from urllib.parse import unquote

import networkx as nx
import orjson

__all__ = ["REF_LEVELS", "TOO_DEEP", "encoded_bytes", "inlined_bytes", "resolve_ref", "unwalked_targets"]

_MAPS = ("$defs", "definitions")
#: nested references an inlining compiler expands (session 27, S27-review27-1): outlines-core's ``parse_ref`` refuses
#: a reference once 3 (``max_recursion_depth``) are open above it, so 4 nest and the 5th is dropped with its property
REF_LEVELS = 4
_K = TypeVar("_K", bound=tuple)
#: :func:`encoded_bytes` of a value nested deeper than :func:`json.dumps` encodes (session 25, S25-review-1)
TOO_DEEP = 1 << 62


def inlined_bytes(schema: Any, size_of: Callable[[Any], int], cap: int) -> int:
    """Compact JSON bytes of ``schema`` with its local references inlined (module docstring), at most ``cap + 1``.

    ``size_of``: a value's compact JSON bytes (a C encoding); it is called once for ``schema`` and once per node
    that a reference reaches. 0 for a schema that is not an object or holds no local reference (nothing to inline:
    the caller's byte bound holds). Raises nothing beyond ``size_of``'s errors."""
    if type(schema) is not dict:
        return 0
    targets, ref_at, refs = _targets(schema)
    if not targets:
        return 0
    kids: dict[int, list[int]] = {}
    if refs is None:  # a reference into the sent schema or below a definition: owners by the nearest target
        refs, kids = _owners(schema, targets, ref_at)
    nodes = {**targets, id(schema): schema}
    sizes: dict[int, int] = {}

    def size(node: Any) -> int:  # each node encoded once, whichever count asks
        key = id(node)
        if key not in sizes:
            sizes[key] = size_of(node)
        return sizes[key]

    total = _acyclic(id(schema), nodes, refs, kids, size, cap)
    if total is None:  # a cycle: by strongly connected components, and unrolled as outlines-core unrolls it
        total = _count(id(schema), nodes, refs, kids, size, cap)
        if total <= cap:
            total = max(total, _unrolled(id(schema), nodes, refs, kids, size, cap))
    return min(total, cap + 1)


def resolve_ref(schema: dict[str, Any], ref: str) -> Any:
    """The node (a dict or list inside ``schema``) that the local reference ``ref`` reaches, as :func:`inlined_bytes`
    resolves it (module docstring: any form outlines-core resolves, and a pointer whose tail does not resolve as the
    deepest node it reaches), or None when it is not local. Raises nothing. Session 27 (expand27): also the targets
    of :func:`gateway.schema_expansion.regex_chars`."""
    return _resolve(schema, ref)


def encoded_bytes(value: dict[str, Any]) -> int:
    """Compact JSON UTF-8 bytes of ``value`` (orjson; an integer beyond 64 bits, a lone surrogate or more than
    orjson's 255 levels, which orjson does not encode, falls back to :func:`json.dumps`), or :data:`TOO_DEEP`
    when ``value`` nests deeper than :func:`json.dumps` encodes (its ``RecursionError``: about 1,000 levels;
    session 25, S25-review-1; moved from gateway/response_format.py in session 29). Raises nothing else."""
    try:
        return len(orjson.dumps(value))
    except (TypeError, orjson.JSONEncodeError):
        import json

        try:
            return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))
        except RecursionError:
            return TOO_DEEP


def unwalked_targets(refs: Iterable[tuple[Any, _K]], walked: set[int]) -> list[tuple[Any, _K]]:
    """``(target, key)`` for each ``(root, key)`` of ``refs`` (``key[0]`` a reference text, resolved inside ``root``
    as :func:`resolve_ref` does; the caller's key is handed back) whose target's ``id`` is not in ``walked`` (the
    ids a bounds walk saw as schemas), each target once; their ids are added to ``walked``. Session 29 (final29,
    S29-final29-1): outlines-core and xgrammar resolve a pointer to any node, so a schema hidden under ``default``
    / ``const`` (which the walk reads as data) or a name map reached as ``#/$defs`` is compiled as a schema and
    must be bounded as one. Session 30 (attack30, S30-attack30-1): also the node xgrammar resolves the text to
    (:func:`_decoded`), when it is another. Work: two resolutions per item of ``refs``. Raises nothing."""
    out: list[tuple[Any, _K]] = []
    for root, key in refs:
        if type(root) is not dict:
            continue
        ref = key[0]  # without % or ~ xgrammar's target is _resolve's own (the same keys), when it has one
        for node in (_resolve(root, ref), _decoded(root, ref) if "%" in ref or "~" in ref else None):
            if node is not None and id(node) not in walked:
                walked.add(id(node))
                out.append((node, key))
    return out


def _decoded(schema: dict[str, Any], ref: str) -> Any:
    """The node xgrammar (0.2.9, ``Grammar.from_json_schema``) resolves ``ref`` to inside ``schema``, or None: a
    ``#/`` pointer whose text after ``#/`` is percent-decoded whole first (``%2F`` then separates parts), then split
    on ``/`` (empty parts dropped, as outlines-core drops them), each part RFC 6901 unescaped (``~1`` ``/``, ``~0``
    ``~``) and looked up only so decoded: an object's key, a list's index of ASCII digits. :func:`_resolve` takes a
    part as written first (outlines-core's way), so ``{"a~1b": {...}, "a/b": {...}}`` holds two targets of
    ``#/default/a~1b``, one per compiler (S30-attack30-1)."""
    if not ref.startswith("#/"):
        return None
    node: Any = schema
    for part in unquote(ref[2:]).split("/"):
        if not part:
            continue
        part = part.replace("~1", "/").replace("~0", "~")
        if type(node) is dict:
            node = node.get(part)
        elif type(node) is list and part.isascii() and part.isdigit() and len(part) < 10 and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
        if type(node) is not dict and type(node) is not list:
            return None
    return node


def _resolve(schema: dict[str, Any], ref: str) -> Any:
    """The node ``ref`` reaches inside ``schema`` (module docstring), or None when it is not local."""
    where, _, name = ref[2:].partition("/")  # the common ``#/$defs/<name>``: one lookup
    # never an empty name (session 27, attack27, S27-attack27-1): outlines-core drops empty parts, so ``#/$defs/``
    # reaches the ``$defs`` map itself, not its ``""`` entry; the general path below resolves it so
    if ref[:2] == "#/" and where in _MAPS and name and type(found := schema.get(where)) is dict and name in found:
        if (type(node := found[name]) is dict or type(node) is list) and "/" not in name and "~" not in name:
            return node
    base, hashes, fragment = ref.partition("#")
    if not hashes:
        base, fragment = "", ref
    elif "#" in fragment or (base and base != schema.get("$id")):
        return None
    node: Any = schema
    for i, part in enumerate(p for p in fragment.split("/") if p):
        nxt = _step(node, part)
        if nxt is None:
            return None if i == 0 else node  # the deepest node it reaches: an upper bound of its target
        node = nxt
    return node


def _step(node: Any, part: str) -> Any:
    """``node``'s child named by pointer part ``part`` (as written, unescaped, percent-decoded), or None.

    A list index is ASCII digits only (RFC 6901 section 4, ``array-index``): '²' or '١' name no item."""
    if type(node) is dict:
        for key in (part, part.replace("~1", "/").replace("~0", "~")):
            if type(found := node.get(key)) is dict or type(found) is list:
                return found
        decoded = unquote(part).replace("~1", "/").replace("~0", "~")
        found = node.get(decoded)
        return found if type(found) is dict or type(found) is list else None
    if type(node) is list and part.isascii() and part.isdigit() and len(part) < 10 and int(part) < len(node):
        found = node[int(part)]
        return found if type(found) is dict or type(found) is list else None
    return None


def _targets(schema: dict[str, Any]) -> tuple[dict[int, Any], dict[int, int], dict[int, list[int]] | None]:
    """``(nodes, ref_at, refs)`` of the schema's local references (each distinct reference text resolved once):
    ``nodes`` ``{id(target): target}``, ``ref_at`` ``{id(object holding a $ref): id(its target)}``, and when every
    target is a member of a top-level definitions map (the common case), the ``refs`` of :func:`_owners` (an owner
    is then the root or the definition holding the reference), else None."""
    nodes: dict[int, Any] = {}
    ref_at: dict[int, int] = {}
    refs: dict[int, list[int]] = {}
    members: set[int] = set()
    resolved: dict[str, Any] = {}
    root = id(schema)
    pending: list[tuple[Any, int]] = []
    for k, v in schema.items():
        if k in _MAPS and type(v) is dict:
            for sub in v.values():
                if type(sub) is dict or type(sub) is list:
                    members.add(id(sub))
                    pending.append((sub, id(sub)))
        elif type(v) is dict or type(v) is list:
            pending.append((v, root))
    if type(ref := schema.get("$ref")) is str and (node := _resolve(schema, ref)) is not None:
        nodes[id(node)] = node
        ref_at[root] = id(node)
        refs[root] = [id(node)]
    while pending:
        cur, owner = pending.pop()
        if type(cur) is dict:
            if type(ref := cur.get("$ref")) is str:
                node = resolved[ref] if ref in resolved else resolved.setdefault(ref, _resolve(schema, ref))
                if node is not None:
                    nodes[id(node)] = node
                    ref_at[id(cur)] = id(node)
                    refs.setdefault(owner, []).append(id(node))
            pending.extend((v, owner) for v in cur.values() if type(v) is dict or type(v) is list)
        else:
            pending.extend((v, owner) for v in cur if type(v) is dict or type(v) is list)
    return nodes, ref_at, (refs if members.issuperset(nodes) else None)


def _owners(schema: dict[str, Any], targets: dict[int, Any],
            ref_at: dict[int, int]) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """``(refs, kids)``: per owner (the root or a referenced node, by id) the targets of the references it holds
    outside its referenced descendants (one per occurrence), and its nearest referenced descendants. The root's
    top-level definitions maps are owned by nobody: only what refers to them brings them in."""
    root = id(schema)
    refs: dict[int, list[int]] = {}
    kids: dict[int, list[int]] = {}
    pending: list[tuple[Any, int | None]] = [(schema, root)]
    while pending:
        cur, owner = pending.pop()
        me = id(cur)
        if me in targets and me != root:
            if owner is not None:
                kids.setdefault(owner, []).append(me)
            owner = me
        if type(cur) is dict:
            if owner is not None and me in ref_at:
                refs.setdefault(owner, []).append(ref_at[me])
            if cur is schema:
                pending.extend((v, None if k in _MAPS and type(v) is dict else owner) for k, v in cur.items()
                               if type(v) is dict or type(v) is list)
            else:
                pending.extend((v, owner) for v in cur.values() if type(v) is dict or type(v) is list)
        else:
            pending.extend((v, owner) for v in cur if type(v) is dict or type(v) is list)
    return refs, kids


def _acyclic(root: int, nodes: dict[int, Any], refs: dict[int, list[int]], kids: dict[int, list[int]],
             size_of: Callable[[Any], int], cap: int) -> int | None:
    """The root's inlined bytes when the owners' graph has no cycle (a depth-first count, each node once), else
    None."""
    inl: dict[int, int] = {}
    ext: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[int, bool]] = [(root, False)]
    while stack:
        v, expanded = stack.pop()
        if expanded:
            added = 0
            for t in refs.get(v, ()):
                added += inl[t]
            for k in kids.get(v, ()):
                added += ext[k]
            ext[v] = added = min(added, cap + 1)
            inl[v] = min(size_of(nodes[v]) + added, cap + 1)
            on_path.discard(v)
            continue
        if v in inl:
            continue
        if v in on_path:
            return None
        on_path.add(v)
        stack.append((v, True))
        for w in refs.get(v, ()):
            if w in on_path:
                return None
            if w not in inl:
                stack.append((w, False))
        for w in kids.get(v, ()):
            if w not in inl:
                stack.append((w, False))
    return inl[root]


def _count(root: int, nodes: dict[int, Any], refs: dict[int, list[int]], kids: dict[int, list[int]],
           size_of: Callable[[Any], int], cap: int) -> int:
    """The root's inlined bytes: the strongly connected components of the owners' graph (edges: references and
    referenced descendants) that the root reaches, counted in reverse topological order by :func:`_settle`.

    The components and their order are networkx's (``condensation``: Tarjan's algorithm with Nuutila's changes,
    without recursion; ``topological_sort``), session 27, S27-tidy27-1 (the own Tarjan it replaced: the same
    counts, tests/gateway/test_s27_tidy27_schema_refs_scc.py). Raises nothing beyond ``size_of``'s errors."""
    graph = nx.DiGraph()
    graph.add_node(root)
    graph.add_edges_from((v, w) for v, ws in refs.items() for w in ws)
    graph.add_edges_from((v, w) for v, ws in kids.items() for w in ws)
    dag = nx.condensation(graph)
    start = dag.graph["mapping"][root]
    reached = nx.descendants(dag, start)  # components the root does not reach are not counted (nor encoded)
    reached.add(start)
    inl: dict[int, int] = {}  # inlined bytes of a node
    ext: dict[int, int] = {}  # the bytes its references add, its own excluded
    for comp in reversed(list(nx.topological_sort(dag))):
        if comp in reached:
            _settle(list(dag.nodes[comp]["members"]), nodes, refs, kids, inl, ext, size_of, cap)
    return inl[root]


def _settle(members: list[int], nodes: dict[int, Any], refs: dict[int, list[int]], kids: dict[int, list[int]],
            inl: dict[int, int], ext: dict[int, int], size_of: Callable[[Any], int], cap: int) -> None:
    """Count one strongly connected component (its successors are counted): a node without a cycle exactly; a
    cycle's nodes once each plus each reference inside it once as its target's bytes, the same for each."""
    inside = set(members)
    sizes = {m: size_of(nodes[m]) for m in members}
    added = 0
    for m in members:
        for t in refs.get(m, ()):
            added += sizes[t] if t in inside else inl[t]
        for k in kids.get(m, ()):
            added += 0 if k in inside else ext[k]
        added = min(added, cap + 1)
    if len(members) == 1 and members[0] not in refs.get(members[0], ()):
        m = members[0]
        ext[m] = added
        inl[m] = min(sizes[m] + added, cap + 1)
        return
    total = min(sum(sizes.values()) + added, cap + 1)
    for m in members:
        inl[m] = ext[m] = total


def _unrolled(root: int, nodes: dict[int, Any], refs: dict[int, list[int]], kids: dict[int, list[int]],
              size_of: Callable[[Any], int], cap: int, levels: int = REF_LEVELS) -> int:
    """The root's inlined bytes with every reference expanded up to ``levels`` nested references and none beyond
    (session 27, S27-review27-1): what outlines-core builds from a reference cycle. :func:`_count` counts a cycle's
    nodes about once, but the compiler unrolls it: a root of 140 bytes with 6 optional properties each ``{"$ref":
    "#"}`` counted 980 bytes and outlines-core 0.2.14 built a 6.9 MB regular expression from it (12 such properties:
    3,250 bytes counted, k**4 copies built). Level ``d`` (the number of references open above a node) counts
    ``inl_d(v) = size(v) + sum(inl_{d+1}(t) for v's references t) + sum(ext_d(k) for v's referenced descendants k)``,
    ``inl_{levels+1} = 0``; each figure capped at ``cap + 1``. Work: ``levels + 1`` passes over the nodes reached
    and their edges, no recursion."""
    reach = [root]
    seen = {root}
    for v in reach:  # grows while read: every node reachable over references and referenced descendants
        for w in (*refs.get(v, ()), *kids.get(v, ())):
            if w not in seen:
                seen.add(w)
                reach.append(w)
    order: list[int] = []  # referenced descendants before the node that holds them (containment is a forest)
    placed: set[int] = set()
    for start in reach:
        if start in placed:
            continue
        stack = [(start, False)]
        while stack:
            v, done = stack.pop()
            if done:
                order.append(v)
                continue
            if v in placed:
                continue
            placed.add(v)
            stack.append((v, True))
            stack.extend((k, False) for k in kids.get(v, ()) if k not in placed)
    own = {v: size_of(nodes[v]) for v in reach}
    below = dict.fromkeys(reach, 0)  # inl_{d+1}; none beyond the last level
    for _ in range(levels + 1):
        ext: dict[int, int] = {}
        here: dict[int, int] = {}
        for v in order:
            added = 0
            for t in refs.get(v, ()):
                added += below[t]
            for k in kids.get(v, ()):
                added += ext[k]
            ext[v] = added = min(added, cap + 1)
            here[v] = min(own[v] + added, cap + 1)
        below = here
    return below[root]
