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
  states (or ``cap * WORK_PER_STATE`` transitions tried). Its alphabet is every *possible* cell of the classes'
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
are the DFA's; bench/s30_pattern30_states.py): never below it but for regex-automata's match delay, which can split
a state in two by whether the previous one matched (``[ab]*a[ab]{3}``: 17 counted, 32 there); the default cap is
chosen on outlines-core's measured cost, not on this count. Work: O(expanded positions) to build, then O(states x
cells) big-integer operations, both bounded by ``cap``; the parse is one pass (O(characters)).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

__all__ = ["UNICODE_CLASS_STATES", "WORK_PER_STATE", "pattern_states"]

#: mid-character states of Rust's Unicode ``\\w``, ``\\d``, ``\\s`` in regex-automata's UTF-8 automaton (outlines-core
#: 0.2.14's ``Index`` over the 256 single bytes: ``\\w`` 317 states, ``\\d`` 26, ``\\s`` 9; rounded up)
UNICODE_CLASS_STATES = {"w": 320, "d": 32, "s": 16}
#: transitions tried per state counted before the count stops (its own CPU bound: ``cap * WORK_PER_STATE``)
WORK_PER_STATE = 64
_MAX_NEST = 200
_ASCII_UNI = {"d": ((48, 57),), "w": ((48, 57), (65, 90), (95, 95), (97, 122)), "s": ((9, 13), (32, 32))}
_UNI_CUTS = (9, 14, 32, 33, 48, 58, 65, 91, 95, 96, 97, 123, 128)
#: the non-ASCII kinds of a character a cell may be (in \w and \d, in \w only, in \s, in none) and the Unicode
#: classes (``dswDSW``) holding it
_KINDS = (frozenset("dwS"), frozenset("wDS"), frozenset("sDW"), frozenset("DWS"))
_SIMPLE = {"n": 10, "t": 9, "r": 13, "f": 12, "v": 11, "a": 7}
_HEX = frozenset("0123456789abcdefABCDEF")
_FLAGS = frozenset("imsUuR-")
_NAME = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_EMPTY = ("e",)


class _Unknown(Exception):
    """A construct this count does not model (counted as over the cap: fail closed)."""


def pattern_states(pattern: str, cap: int) -> int:
    """The states (character-boundary subsets plus mid-character UTF-8 states, see the module docstring) of the
    deterministic automaton of ``pattern`` (a JSON schema ``pattern`` string) as outlines-core inlines it, or
    ``cap + 1`` when they pass ``cap`` (an int >= 0), when the work passes ``cap * WORK_PER_STATE`` transitions or
    when the pattern uses a construct not modelled (fail closed). Raises nothing. Pure: same answer for the same
    arguments."""
    text = pattern[1:-1] if len(pattern) >= 2 and pattern[0] == "^" and pattern[-1] == "$" else pattern
    try:
        parser = _Parser(text)
        tree = parser.tree()
    except (_Unknown, RecursionError, ValueError, OverflowError):
        return cap + 1
    if _size(tree, cap) > cap:
        return cap + 1
    return _count(tree, parser.classes, cap)


def _size(node: tuple, cap: int) -> int:
    """Expanded positions of ``node``, or ``cap + 1`` once past ``cap``."""
    kind = node[0]
    if kind == "c":
        return 1
    if kind == "e":
        return 0
    if kind == "rep":
        inner = _size(node[1], cap)
        copies = node[3] if node[3] is not None else max(node[2], 1)
        return min(inner * copies, cap + 1)
    total = 0
    for child in node[1]:
        total += _size(child, cap)
        if total > cap:
            return cap + 1
    return total


class _Parser:
    """One pass over Rust ``regex`` syntax (the subset of the module docstring) into a tree of tuples: ``("c", id)``
    a position of class ``id`` (``classes[id]``: ``(intervals, unicode classes, negated)``), ``("cat", [...])``,
    ``("alt", [...])``, ``("rep", node, m, n or None)``, ``("e",)``. Raises :class:`_Unknown`."""

    def __init__(self, text: str) -> None:
        self.t, self.i, self.n = text, 0, len(text)
        self.classes: list[tuple[tuple[tuple[int, int], ...], str, bool]] = []
        self._ids: dict[tuple, int] = {}

    def tree(self) -> tuple:
        node = self._alt([""], 0)
        if self.i != self.n:  # an unbalanced ")"
            raise _Unknown
        return node

    def _class(self, ivs: list[tuple[int, int]], uni: str, neg: bool, flags: str) -> tuple:
        if "i" in flags:
            ivs = _fold(ivs)
        key = (_merge(ivs), "".join(sorted(set(uni))), neg)
        cid = self._ids.setdefault(key, len(self.classes))
        if cid == len(self.classes):
            self.classes.append(key)
        return ("c", cid)

    def _alt(self, flags: list[str], depth: int) -> tuple:
        if depth > _MAX_NEST:
            raise _Unknown
        branches = [self._cat(flags, depth)]
        while self.i < self.n and self.t[self.i] == "|":
            self.i += 1
            branches.append(self._cat(flags, depth))
        return branches[0] if len(branches) == 1 else ("alt", branches)

    def _cat(self, flags: list[str], depth: int) -> tuple:
        t, items = self.t, []
        while self.i < self.n and t[self.i] not in "|)":
            atom = self._atom(flags, depth)
            if atom is None:  # a flag group: no atom to repeat
                if self.i < self.n and t[self.i] in "*+?{":
                    raise _Unknown
                continue
            while self.i < self.n and t[self.i] in "*+?{":
                c = t[self.i]
                if c == "{":
                    end = t.find("}", self.i)
                    if end < 0:
                        raise _Unknown
                    lo, comma, hi = t[self.i + 1:end].partition(",")
                    if not lo.isdecimal() or (hi and not hi.isdecimal()) or len(lo) > 9 or len(hi) > 9:
                        raise _Unknown
                    m, top = int(lo), (int(hi) if hi else None) if comma else int(lo)
                    if top is not None and top < m:
                        raise _Unknown
                    self.i = end + 1
                else:
                    m, top = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
                    self.i += 1
                if self.i < self.n and t[self.i] == "?":  # lazy: the same automaton
                    self.i += 1
                atom = ("rep", atom, m, top)
            items.append(atom)
        return _EMPTY if not items else items[0] if len(items) == 1 else ("cat", items)

    def _atom(self, flags: list[str], depth: int) -> tuple | None:
        t, c = self.t, self.t[self.i]
        if c in "*+?{":  # a quantifier with nothing to repeat
            raise _Unknown
        if c == "(":
            inner = flags[0]
            if t.startswith("(?", self.i):
                j = self.i + 2
                if t.startswith(":", j):
                    j += 1
                elif t.startswith(("P<", "<"), j) and not t.startswith(("<=", "<!"), j):
                    j += 2 if t[j] == "P" else 1
                    k = j
                    while k < self.n and t[k] in _NAME:
                        k += 1
                    if k == j or k >= self.n or t[k] != ">":
                        raise _Unknown
                    j = k + 1
                else:
                    k = j
                    while k < self.n and t[k] in _FLAGS:
                        k += 1
                    if k == j or k >= self.n or t[k] not in "):":
                        raise _Unknown
                    inner = _flags(inner, t[j:k])
                    if t[k] == ")":  # (?i): the rest of the enclosing group
                        flags[0] = inner
                        self.i = k + 1
                        return None
                    j = k + 1
                self.i = j
            else:
                self.i += 1
            node = self._alt([inner], depth + 1)
            if self.i >= self.n or t[self.i] != ")":
                raise _Unknown
            self.i += 1
            return node
        self.i += 1
        if c == "[":
            return self._bracket(flags[0])
        if c == ".":
            return self._class([] if "s" in flags[0] else [(10, 10)], "", True, "")
        if c == "^" or c == "$":
            return _EMPTY
        if c == "\\":
            kind, value = self._escape(in_class=False)
            if kind == "a":
                return _EMPTY
            if kind == "u":
                return self._class([], value, False, flags[0])
            return self._class([(value, value)], "", False, flags[0])
        return self._class([(ord(c), ord(c))], "", False, flags[0])

    def _bracket(self, flags: str) -> tuple:
        t = self.t
        neg = t.startswith("^", self.i)
        self.i += neg
        ivs: list[tuple[int, int]] = []
        uni = ""
        first = True
        while True:
            if self.i >= self.n or t[self.i] == "[" or t.startswith(("&&", "--", "~~"), self.i):
                raise _Unknown
            c = t[self.i]
            if c == "]" and not first:
                self.i += 1
                return self._class(ivs, uni, neg, flags)
            first = False
            lo = self._member()
            if type(lo) is str:
                uni += lo
                continue
            if t.startswith("-", self.i) and self.i + 1 < self.n and t[self.i + 1] != "]":
                self.i += 1
                hi = self._member()
                if type(hi) is str or hi < lo:
                    raise _Unknown
                ivs.append((lo, hi))
            else:
                ivs.append((lo, lo))

    def _member(self) -> int | str:
        """A class member at ``i``: a code point, or the letters of a Unicode class escape."""
        c = self.t[self.i]
        self.i += 1
        if c != "\\":
            return ord(c)
        kind, value = self._escape(in_class=True)
        if kind == "a":
            raise _Unknown
        return value

    def _escape(self, in_class: bool) -> tuple[str, object]:
        """After ``\\``: ``("c", code point)``, ``("u", "d"...)`` a Unicode class, ``("a", None)`` an assertion."""
        t, i = self.t, self.i
        if i >= self.n:
            raise _Unknown
        c = t[i]
        if c in "xuU":
            if t.startswith("{", i + 1):
                end = t.find("}", i + 2)
                digits, nxt = (t[i + 2:end], end + 1) if end > 0 else ("", 0)
            else:
                width = {"x": 2, "u": 4, "U": 8}[c]
                digits, nxt = t[i + 1:i + 1 + width], i + 1 + width
                digits = digits if len(digits) == width else ""
            if not digits or len(digits) > 8 or not _HEX.issuperset(digits) or int(digits, 16) > 0x10FFFF:
                raise _Unknown
            self.i = nxt
            return "c", int(digits, 16)
        self.i = i + 1
        if c in "dswDSW":
            return "u", c
        if c in _SIMPLE:
            return "c", _SIMPLE[c]
        if c in "bBAz" and not in_class:
            return "a", None
        if c.isascii() and not c.isalnum() and c.isprintable() and c != " ":
            return "c", ord(c)
        raise _Unknown


def _flags(current: str, spec: str) -> str:
    """``current`` flags after a flag group's ``spec`` (``i-s``); the ``x`` flag is refused before."""
    on, _, off = spec.partition("-")
    return "".join(sorted((set(current) | set(on)) - set(off)))


def _fold(ivs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ivs`` closed under Rust's simple case folding, for ASCII members (``k`` also folds to U+212A, ``s`` to
    U+017F); a member past ASCII raises :class:`_Unknown` (not modelled)."""
    out = list(ivs)
    for lo, hi in ivs:
        if hi > 127:
            raise _Unknown
        for a, b, shift in ((65, 90, 32), (97, 122, -32)):
            if lo <= b and hi >= a:
                out.append((max(lo, a) + shift, min(hi, b) + shift))
        for letters, other in (("kK", 0x212A), ("sS", 0x17F)):
            if any(lo <= ord(x) <= hi for x in letters):
                out.append((other, other))
    return out


def _merge(ivs: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    out: list[list[int]] = []
    for lo, hi in sorted(ivs):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((a, b) for a, b in out)


def _has(ivs: tuple[tuple[int, int], ...], cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in ivs)


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
    ``cap``."""
    follow: list[int] = [0]  # position 0: the start
    cls_of: list[int] = [-1]
    where = [0] * len(classes)

    def link(last: int, first: int) -> None:
        while last:
            low = last & -last
            follow[low.bit_length() - 1] |= first
            last ^= low

    def build(node: tuple) -> tuple[int, int, bool]:  # (first, last, nullable)
        kind = node[0]
        if kind == "c":
            p = len(follow)
            follow.append(0)
            cls_of.append(node[1])
            where[node[1]] |= 1 << p
            return 1 << p, 1 << p, False
        if kind == "e":
            return 0, 0, True
        if kind == "alt":
            first = last = 0
            nullable = False
            for child in node[1]:
                f, la, nu = build(child)
                first, last, nullable = first | f, last | la, nullable or nu
            return first, last, nullable
        if kind == "cat":
            parts = [build(child) for child in node[1]]
        else:  # rep
            _, body, m, top = node
            parts = [build(body) for _ in range(max(m, 1) if top is None else m)]
            if top is None:
                if m == 0:
                    parts[0] = (parts[0][0], parts[0][1], True)
                f, la, _ = parts[-1]
                link(la, f)
            else:
                tail = [build(body) for _ in range(top - m)]
                t_first, t_last = 0, 0
                for f, la, nu in reversed(tail):  # nested: after copy i, copy i + 1 or out
                    link(la, t_first)
                    t_first, t_last = f | (t_first if nu else 0), la | t_last
                if tail:
                    parts.append((t_first, t_last, True))
        first, last, nullable = 0, 0, True
        for f, la, nu in parts:
            link(last, f)
            first |= f if nullable else 0
            last = la | (last if nu else 0)
            nullable = nullable and nu
        return first, last, nullable

    first, _, _ = build(tree)
    follow[0] = first
    weight = [_weight(c) for c in classes]
    cell_bits = _cells(classes)
    of = [0] + [cell_bits[c] for c in cls_of[1:]]  # each position's cells
    masks: dict[int, int] = {}  # cell -> positions whose class holds it (the slow path's alphabet)
    for c, bits in enumerate(cell_bits):
        while bits:
            low = bits & -bits
            masks[low] = masks.get(low, 0) | where[c]
            bits ^= low
    cells = list(set(masks.values()))
    seen, todo, count, work = {1}, [1], 0, cap * WORK_PER_STATE
    while todo:
        state = todo.pop()
        nxt = 0
        while state:
            low = state & -state
            nxt |= follow[low.bit_length() - 1]
            state ^= low
        count += 1
        acc, det, heavy, ahead = 0, True, set(), []
        s = nxt
        while s:
            low = s & -s
            p = low.bit_length() - 1
            s ^= low
            if acc & of[p]:
                det = False
            acc |= of[p]
            if weight[cls_of[p]]:
                heavy.add(cls_of[p])
            if of[p]:
                ahead.append(low)
        for c in heavy:
            count += weight[c]
        work -= len(ahead) if det else len(ahead) + len(cells)
        if count > cap or work < 0:
            return cap + 1
        for to in ahead if det else (nxt & mask for mask in cells):
            if to and to not in seen:
                seen.add(to)
                todo.append(to)
    return count
