"""``limits.json_schema.max_pattern_states`` (session 30, pattern30, S30-pattern30-1; the hole: S29-pattern29-2): the
states of the automata of a schema's ``pattern`` strings together, as :func:`gateway.pattern_states.pattern_states`
counts them, bounded per request; the walk of gateway/schema_walk.py adds each ``pattern``'s count (a quote-free
pattern's automaton adds its states to the rest of outlines-core's expression: S29-pattern29-1) and answers 400
``json_schema_too_complex`` past the bound.

Each count is cached per tenant (:func:`pattern_cost`, least recently used out): a tenant that sends the same schema
again pays a dictionary look-up, and the key holds the tenant's id, so one tenant cannot tell from its answer's time
whether another sent a pattern. A count costs O(states x cells) big-integer operations, bounded by the cap
(docs/benchmarks.md "Session 30: pattern30").
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from gateway.errors import GatewayError
from gateway.pattern_states import pattern_states
from gateway.schema_refs import inlined_bytes, resolve_ref
from gateway.schema_refusal import path_node, path_param, refused

__all__ = ["CACHED_PATTERN_CHARS", "COST_CACHE_SIZE", "ITEM_KEYS", "REF_COPIES_NODES", "alternatives_cost",
           "cost_cache_info",
           "item_copies", "pattern_cost", "refs_states_refusal", "states_cache_clear", "subtree_states"]

#: keywords whose value is data, never a schema (as gateway/response_format.py reads them)
_DATA = frozenset({"enum", "const", "default", "examples"})
#: keys of an array schema whose value outlines-core writes once per item copy (:func:`item_copies`)
ITEM_KEYS = frozenset({"items", "additionalItems", "contains", "unevaluatedItems"})
#: counts kept (tenant, pattern, cap)
COST_CACHE_SIZE = 4096
#: the longest pattern whose count is cached (characters): the cache holds at most ~4,096 x 2 KiB of keys, whatever
#: a tenant's ``max_pattern_chars``; a longer pattern is counted each time (its work is bounded by the cap)
CACHED_PATTERN_CHARS = 2048


def pattern_cost(tenant: str, pattern: str, cap: int) -> int:
    """:func:`gateway.pattern_states.pattern_states` of ``pattern`` under ``cap`` (``cap + 1``: over it or not
    modelled), cached by ``(tenant, pattern, cap)`` when ``pattern`` has at most :data:`CACHED_PATTERN_CHARS`
    characters; ``tenant``: the tenant's id (only a cache key). Raises nothing."""
    if len(pattern) > CACHED_PATTERN_CHARS:
        return pattern_states(pattern, cap)
    return _cached_cost(tenant, pattern, cap)


@lru_cache(maxsize=COST_CACHE_SIZE)
def _cached_cost(tenant: str, pattern: str, cap: int) -> int:
    return pattern_states(pattern, cap)


def cost_cache_info() -> Any:
    """The cache's ``functools`` statistics (``hits``, ``misses``, ``currsize``; tests and benches)."""
    return _cached_cost.cache_info()


def alternatives_cost(members: list[Any], tenant: str, cap: int) -> int:
    """The states an ``anyOf`` / ``oneOf`` of string schemas with a ``pattern`` adds beyond its members' own counts:
    outlines-core writes the members as one alternation (``("p1"|"p2")``), whose automaton may need the product of
    theirs (``(?:a{7})*`` or ``(?:a{11})*`` or ...: 7 x 11 x ...; S30-pattern30-2). Counted as the pattern
    ``(?:p1)|(?:p2)|...`` (each ``^...$`` dropped as outlines-core drops it) minus the members' counts (each is added
    where the walk meets it), at least 0, or the alternation's ``cap + 1`` when it is over ``cap``; 0 for fewer than
    two such members. ``members``: the list's values."""
    texts = [m["pattern"] for m in members if type(m) is dict and type(m.get("pattern")) is str]
    if len(texts) < 2:
        return 0
    joined = "|".join(f"(?:{t[1:-1] if len(t) >= 2 and t[0] == '^' and t[-1] == '$' else t})" for t in texts)
    together = pattern_cost(tenant, joined, cap)
    return together if together > cap else max(0, together - sum(pattern_cost(tenant, t, cap) for t in texts))


def item_copies(array: dict[str, Any]) -> int:
    """How many times outlines-core writes the item schema of ``array`` (a schema object) in its expression, each
    copy with its own states (``[item(,item){m-1,n-1}]``: ``n`` copies, ``{m-1,}``: ``m``, none: ``(item(,item)*)?``
    2; measured: an array of a 8,193-state pattern 16,392 DFA states): 1 + the larger integer of ``minItems`` /
    ``maxItems``, at least 2. Its values are bounded by ``max_item_count`` (default 128) in the same walk."""
    counts = [v for v in (array.get("minItems"), array.get("maxItems")) if type(v) is int and v > 0]
    return 1 + max(counts, default=1)


def refs_states_refusal(roots: list[tuple[Any, tuple[str, ...]]], bound: dict[str, Any], what: str,
                        subject: str, copies: int = 1) -> GatewayError | None:
    """``max_pattern_states`` over each schema of ``roots`` (``(schema, path)``) with its local ``$ref`` inlined:
    outlines-core writes a reference's target at each reference, each copy with its own states (8 properties
    referring to one definition of ``[ab]*a`` + 12 ``[ab]``: 65,626 DFA states, 8 x 8,204; S30-pattern30-6), which
    the walk counts once. :func:`gateway.schema_refs.inlined_bytes` with :func:`subtree_states` as each node's size
    (the definitions counted once more, an over-count); nothing for a schema without references, nor when the walk
    (gateway/schema_walk.py ``walk_bounds``, which leaves its sum in ``bound["states"]``) met no pattern. The 400, or
    None."""
    cap = bound["max_pattern_states"]
    if cap is None or not bound.get("states"):  # no pattern was walked: references cannot add states
        return None
    for root, path in roots:
        if inlined_bytes(root, lambda node: subtree_states(node, bound["tenant"], cap), cap) * copies > cap:
            return refused(path_param(path_node(path)), f"{subject} has patterns whose automata need more than {cap} "
                           "states together once its $ref are inlined", "max_pattern_states", what)
    return None


def subtree_states(node: Any, tenant: str, cap: int, times: int = 1, root: Any = None,
                   nodes: list[int] | None = None) -> int:
    """``times`` x the :func:`pattern_cost` of every ``pattern`` in ``node``'s schemas (array items times
    :func:`item_copies`; ``enum`` / ``const`` / ``default`` / ``examples`` data skipped), at most ``cap + 1``; 0 for
    a ``node`` that holds no dict (None too).

    ``root``: None, references not followed (each node's size in :func:`refs_states_refusal`); or the schema (a
    dict) whose local ``$ref`` are followed, as :func:`gateway.schema_refs.resolve_ref` resolves them, not along a
    cycle (one that does not resolve counts nothing). The walk's second use (gateway/schema_walk.py; session 30,
    review30, S30-review30-2): ``node`` the target of a ``$ref`` that sits where its schema is written ``times + 1``
    times (an array's items), ``times`` the copies outlines-core writes beyond the one the walk counts where the
    target is defined and :func:`refs_states_refusal` inlines once per reference. ``nodes``: None, no bound; or
    ``[the nodes the walk's calls may still visit]`` (:data:`REF_COPIES_NODES` per walk), decremented per node;
    past it the count stops and answers what it found (a schema that inlines to that many nodes is over
    ``max_bytes``, checked next; a tenant with a larger ``max_bytes`` is under-counted there). Raises nothing."""
    total = 0
    stack: list[tuple[Any, int, frozenset[int]]] = [(node, times, frozenset((id(node),)))]
    while stack:
        cur, times, path = stack.pop()
        if nodes is not None:
            nodes[0] -= 1
            if nodes[0] < 0:
                return total
        if type(cur) is list:
            stack.extend((v, times, path) for v in cur if type(v) is dict or type(v) is list)
            continue
        if type(cur) is not dict:
            continue
        if root is not None and type(inner := cur.get("$ref")) is str and (
                to := resolve_ref(root, inner)) is not None and id(to) not in path:
            stack.append((to, times, path | {id(to)}))
        for key, value in cur.items():
            if key == "pattern" and type(value) is str:
                total += times * pattern_cost(tenant, value, cap)
                if total > cap:
                    return cap + 1
            elif key not in _DATA and (type(value) is dict or type(value) is list):
                stack.append((value, times * item_copies(cur) if key in ITEM_KEYS else times, path))
    return total


#: the schema nodes :func:`subtree_states` visits at most in the walk's counts of the copies of ``$ref`` targets
#: (a schema that inlines to more nodes is over the default ``max_bytes``, each node one byte at least)
REF_COPIES_NODES = 65_536


def states_cache_clear() -> None:
    """Empty :func:`pattern_cost`'s cache (benches and tests)."""
    _cached_cost.cache_clear()
