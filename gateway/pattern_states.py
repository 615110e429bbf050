"""How many states a JSON schema ``pattern`` costs an inlining compiler that determinises it (session 30, pattern30,
S30-pattern30-1; the hole: S29-pattern29-2, S28-attack28-2).

outlines-core (0.2.14) inlines a string's ``pattern`` between ``"`` and builds, before the first token and with no
timeout, regex-automata's **dense DFA** of the whole expression (every state, all at once), then walks every
vocabulary token from every state. A quote-free pattern (S29-pattern29-1 refuses the others) adds its own
automaton's states to the rest's, but determinising it can still blow up: ``[ab]*a`` followed by ``k`` ``[ab]``
needs ``2**(k+1)`` states (k 20: past 3 GiB), and a counted Unicode class costs hundreds of byte-level states per
position (``[\\w-]{1,63}`` x 8: 4.2 s, 456 MB).

:func:`pattern_states` counts them, stopping at ``cap``:

* the pattern is parsed as outlines-core inlines it (``^``/``$`` dropped when both are there), in Rust ``regex``
  syntax, restricted to what :mod:`gateway.pattern_quote` also knows: literals, ``.``, classes with ranges and
  ``\\d \\s \\w \\D \\S \\W``, escapes of characters, groups (``(``, ``(?:``, named, flag groups of ``i m s U u R``),
  ``|``, ``* + ? {m} {m,} {m,n}`` (lazy forms too), assertions (``^ $ \\b \\B \\A \\z``, counted as empty: an
  assertion only removes paths). Anything else counts as over the cap (fail closed), as does a ``(?i)`` class with
  a member past ASCII (case folding there is not modelled).
* counted repetitions are expanded as regex-automata's Thompson compiler expands them (``e{m,n}``: ``m`` copies,
  then ``n - m`` nested optional copies; ``e{m,}``: ``m`` copies, the last looped): the expanded positions are
  computed first and over ``cap`` count as over (no allocation grows past ``cap``).
* the position (Glushkov) automaton of the expansion is determinised by a subset construction that stops at ``cap``
  states; its own work (positions linked while building, unioned and looked at per state, cells tried) is charged
  as states, :data:`WORK_PER_STATE` units each, so it stops at ``cap * WORK_PER_STATE`` units too. Its alphabet is every *possible* cell of the classes'
  Boolean combination: each ASCII interval on which all classes agree, and each non-ASCII interval four times
  (in ``\\w`` and ``\\d``, in ``\\w`` only, in ``\\s``, in none), since Rust's Unicode tables are not at hand. Each
  real character falls in one of these cells, so the subsets reached are a superset of the real DFA's character-
  boundary states: the count never falls below them (sound), and is exact for ASCII classes.
* each character-boundary state ``S`` also counts the mid-character states of the UTF-8 automata its next positions
  can enter: for each next position whose class holds non-ASCII characters, its class's weight (the byte-range
  sequences of its non-ASCII intervals, regex-syntax's ``Utf8Sequences`` split, times their inner bytes, plus
  :data:`UNICODE_CLASS_STATES` for ``\\w \\d \\s`` and their negations, measured on outlines-core). A byte prefix
  leaves each entered class automaton in one node, so the mid-character sets after ``S`` are at most the sum of
  the nodes (an over-count where classes share suffixes).

Checked against outlines-core's own count (its ``Index`` over a vocabulary of the 256 single bytes, whose states
are the DFA's; bench/s30_pattern30_states.py): never below it on the 74 patterns measured once the 12 states of the
object around the pattern are added (``[ab]*a`` + k ``[ab]``: 2**(k+1) + 1 here, 2**(k+1) + 12 there; a bare
pattern, not followed by the closing quote as every inlined one is, can take regex-automata up to twice the states
by match status: ``[ab]*a[ab]{3}`` alone 32, 17 here). It counts states, not
their cost: outlines-core stores every vocabulary token each state allows (docs/security.md S30-pattern30-4).
Work: one pass to parse, then at most ``cap * WORK_PER_STATE`` units, the alphabet's construction included (session
30, review30, S30-review30-1: it was not, and cost positions x cells x cells/64: 56 s for a 508-character pattern)
(positions are ints, a state of one position its int, of more a frozenset: no big bit sets); ordinary patterns 13 µs-1.6 ms, a refused one at 16,384 35-55 ms.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from gateway.pattern_parse import PatternUnknown, expanded_positions, parse_pattern

__all__ = ["UNICODE_CLASS_STATES", "WORK_PER_STATE", "pattern_states"]

#: mid-character states of Rust's Unicode ``\\w``, ``\\d``, ``\\s`` in regex-automata's UTF-8 automaton (outlines-core
#: 0.2.14's ``Index`` over the 256 single bytes: ``\\w`` 317 states, ``\\d`` 26, ``\\s`` 9; rounded up)
UNICODE_CLASS_STATES = {"w": 320, "d": 32, "s": 16}
#: the count's own work (positions linked, unioned, looked at, cells tried) one state pays for: a pattern is charged
#: ``max(states, work / WORK_PER_STATE)``, so the work of a schema's patterns stays under ``cap * WORK_PER_STATE``
WORK_PER_STATE = 16
_ASCII_UNI = {"d": ((48, 57),), "w": ((48, 57), (65, 90), (95, 95), (97, 122)), "s": ((9, 13), (32, 32))}
_UNI_CUTS = (9, 14, 32, 33, 48, 58, 65, 91, 95, 96, 97, 123, 128)
#: the non-ASCII kinds of a character a cell may be (in \w and \d, in \w only, in \s, in none) and the Unicode
#: classes (``dswDSW``) holding it
_KINDS = (frozenset("dwS"), frozenset("wDS"), frozenset("sDW"), frozenset("DWS"))


def pattern_states(pattern: str, cap: int) -> int:
    """The states (character-boundary subsets plus mid-character UTF-8 states, see the module docstring) of the
    deterministic automaton of ``pattern`` (a JSON schema ``pattern`` string) as outlines-core inlines it, or
    ``cap + 1`` when they pass ``cap`` (an int >= 0), when the work passes ``cap * WORK_PER_STATE`` transitions or
    when the pattern uses a construct not modelled (fail closed). Raises nothing. Pure: same answer for the same
    arguments."""
    text = pattern[1:-1] if len(pattern) >= 2 and pattern[0] == "^" and pattern[-1] == "$" else pattern
    try:
        tree, classes = parse_pattern(text)
    except (PatternUnknown, RecursionError, ValueError, OverflowError):
        return cap + 1
    if expanded_positions(tree, cap) > cap:
        return cap + 1
    return _count(tree, classes, cap)


class _Over(Exception):
    """The count's work passed its budget."""


def _sequences(lo: int, hi: int, nbytes: int) -> int:
    """UTF-8 byte-range sequences of ``[lo, hi]`` (all ``nbytes`` long), split as regex-syntax's ``Utf8Sequences``."""
    for k in range(1, nbytes):
        m = (1 << (6 * k)) - 1
        if (lo & ~m) != (hi & ~m):
            if lo & m:
                return _sequences(lo, lo | m, nbytes) + _sequences((lo | m) + 1, hi, nbytes)
            if (hi & m) != m:
                return _sequences(lo, (hi & ~m) - 1, nbytes) + _sequences(hi & ~m, hi, nbytes)
    return 1


def _weight(cls: tuple[tuple[tuple[int, int], ...], str, bool]) -> int:
    """Mid-character states of class ``cls``'s UTF-8 automaton (0 for an ASCII-only class)."""
    ivs, uni, neg = cls
    if neg:  # the complement's explicit intervals
        gaps, start = [], 0
        for lo, hi in ivs:
            if lo > start:
                gaps.append((start, lo - 1))
            start = hi + 1
        if start <= 0x10FFFF:
            gaps.append((start, 0x10FFFF))
        ivs = tuple(gaps)
    total = sum(UNICODE_CLASS_STATES[u] for u in set(uni.lower()))
    for lo, hi in ivs:
        for a, b, nbytes in ((0x80, 0x7FF, 2), (0x800, 0xFFFF, 3), (0x10000, 0x10FFFF, 4)):
            if max(lo, a) <= min(hi, b):
                total += _sequences(max(lo, a), min(hi, b), nbytes) * (nbytes - 1)
    return total


def _cells(classes: list) -> list[int]:
    """Each class's possible cells (module docstring) as a bit set over the cells: an ASCII interval on which all
    classes agree is one cell, a non-ASCII one four (one per kind of :data:`_KINDS`)."""
    cuts = {0, *_UNI_CUTS}
    for ivs, _, _ in classes:
        for lo, hi in ivs:
            cuts.add(lo)
            cuts.add(hi + 1)
    edges = sorted(c for c in cuts if c <= 0x10FFFF)
    na = bisect_left(edges, 128)  # ASCII intervals
    wide = len(edges) - na
    all_ascii, all_wide = (1 << na) - 1, ((1 << (4 * wide)) - 1) << na
    kinds = [sum(1 << (na + 4 * j + k) for j in range(wide)) for k in range(4)]

    def span(lo: int, hi: int) -> int:  # the cells of [lo, hi] (both ends are edges' bounds)
        a, b = bisect_right(edges, lo) - 1, bisect_right(edges, hi)
        bits = ((1 << (min(b, na) - a)) - 1) << a if a < na else 0
        if b > na:
            wa = max(a, na) - na
            bits |= ((1 << (4 * (b - na - wa))) - 1) << (na + 4 * wa)
        return bits

    out = []
    for ivs, uni, neg in classes:
        bits = 0
        for lo, hi in ivs:
            bits |= span(lo, hi)
        for u in uni:
            low = 0
            for lo, hi in _ASCII_UNI[u.lower()]:
                low |= span(lo, hi)
            bits |= (all_ascii ^ low) if u.isupper() else low
            for k, kind in enumerate(_KINDS):
                if u in kind:
                    bits |= kinds[k]
        out.append(bits ^ (all_ascii | all_wide) if neg else bits)
    return out


def _count(tree: tuple, classes: list, cap: int) -> int:
    """The subset construction of ``tree``'s position automaton with weights (module docstring), stopping at
    ``cap``. Positions are ints (0: the start), sets of them Python sets; a state of one position is its int, of
    more a frozenset (most states of ordinary patterns are single positions: no big bit sets, no per-cell pass)."""
    follow: list[set[int]] = [set()]
    cls_of: list[int] = [-1]
    empty: frozenset[int] = frozenset()
    budget = [cap * WORK_PER_STATE]  # work left

    def link(last: frozenset[int], first: frozenset[int]) -> None:
        if first:
            budget[0] -= len(last) * len(first)
            if budget[0] < 0:
                raise _Over
            for p in last:
                follow[p].update(first)

    def build(node: tuple) -> tuple[frozenset[int], frozenset[int], bool]:  # (first, last, nullable)
        kind = node[0]
        if kind == "c":
            p = len(follow)
            follow.append(set())
            cls_of.append(node[1])
            return frozenset((p,)), frozenset((p,)), False
        if kind == "e":
            return empty, empty, True
        if kind == "alt":
            built = [build(child) for child in node[1]]
            return (frozenset().union(*(b[0] for b in built)), frozenset().union(*(b[1] for b in built)),
                    any(b[2] for b in built))
        if kind == "cat":
            parts = [build(child) for child in node[1]]
        else:  # rep
            _, body, m, top = node
            if body[0] == "c" and top is not None and top > 1:  # a counted class, the commonest: a chain in one go
                p, n = len(follow), top
                follow.extend({p + k + 1} for k in range(n - 1))
                follow.append(set())
                cls_of.extend([body[1]] * n)
                return frozenset((p,)), frozenset(range(p + max(m - 1, 0), p + n)), m == 0
            parts = [build(body) for _ in range(max(m, 1) if top is None else m)]
            if top is None:
                if m == 0:
                    parts[0] = (parts[0][0], parts[0][1], True)
                link(parts[-1][1], parts[-1][0])
            else:
                tail = [build(body) for _ in range(top - m)]
                t_first, t_last = empty, empty
                for f, la, nu in reversed(tail):  # nested: after copy i, copy i + 1 or out
                    link(la, t_first)
                    t_first, t_last = (f | t_first) if nu else f, la | t_last
                if tail:
                    parts.append((t_first, t_last, True))
        first, last, nullable = empty, empty, True
        for f, la, nu in parts:
            link(last, f)
            if nullable:
                first = first | f
            last = (la | last) if nu else la
            nullable = nullable and nu
        return first, last, nullable

    try:
        follow[0] = set(build(tree)[0])
    except _Over:
        return cap + 1
    weight = [_weight(c) for c in classes]
    cell_bits = _cells(classes)
    of = [0] + [cell_bits[c] for c in cls_of[1:]]  # each position's cells
    heavy = [weight[c] > 0 for c in cls_of[1:]]
    heavy.insert(0, False)
    cells: list[frozenset[int]] = []  # the alphabet: the positions of each cell; built at the first need

    def alphabet(work: int) -> tuple[list[frozenset[int]], int]:  # and the work left; _Over past it
        # S30-review30-1: per class, its bits read once in C, and charged (per position and bit: 56 s of CPU)
        by_class: dict[int, list[int]] = {}
        for p in range(1, len(follow)):
            by_class.setdefault(cls_of[p], []).append(p)
        work -= len(follow)
        holders: dict[int, list[int]] = {}  # cell -> the classes holding it
        for c in by_class:
            bits = bin(cell_bits[c])[:1:-1]  # bit i at index i
            work -= bits.count("1") + len(bits) // 64
            if work < 0:
                raise _Over
            i = bits.find("1")
            while i >= 0:
                holders.setdefault(i, []).append(c)
                i = bits.find("1", i + 1)
        out: list[frozenset[int]] = []
        for group in {tuple(v) for v in holders.values()}:  # each cell's positions: its classes' positions
            work -= sum(len(by_class[c]) for c in group)
            if work < 0:
                raise _Over
            out.append(frozenset(p for c in group for p in by_class[c]))
        return out, work

    seen: set[object] = {0}
    todo: list[object] = [0]
    count, work = 0, budget[0]
    while todo:
        state = todo.pop()
        if type(state) is int:
            nxt = follow[state]
        else:
            nxt = set().union(*(follow[p] for p in state))
            work -= len(state)
        count += 1 + (sum(weight[c] for c in {cls_of[p] for p in nxt if heavy[p]}) if nxt else 0)
        acc, det = 0, True
        for q in nxt:  # the next positions' classes disjoint: the next states are single positions
            if acc & of[q]:
                det = False
                break
            acc |= of[q]
        if det:
            work -= len(nxt)
            ahead: list[object] = list(nxt)
        else:
            if not cells:
                try:
                    cells, work = alphabet(work)
                except _Over:
                    return cap + 1
            work -= len(cells) + len(nxt)
            ahead = []
            for cell in cells:
                to = cell.intersection(nxt)
                if to:
                    ahead.append(next(iter(to)) if len(to) == 1 else to)
        if count > cap or work < 0:
            return cap + 1
        for to in ahead:
            if to not in seen:
                seen.add(to)
                todo.append(to)
    return max(count, -(-(cap * WORK_PER_STATE - work) // WORK_PER_STATE))  # the work, charged as states
