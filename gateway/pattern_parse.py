"""The parse of a JSON schema ``pattern`` in Rust ``regex`` syntax (the subset :mod:`gateway.pattern_quote` knows) into
the tree :mod:`gateway.pattern_states` counts (session 30, pattern30, S30-pattern30-1). No maintained library fits:
Python's ``re`` parser is private, ``interegular`` (0.3.3) and ``greenery`` (4.2) read Python's syntax with ASCII
``\\w`` / ``\\d`` (Rust's are Unicode: ``\\w*é\\w{k}`` blows up there, not in them), expose their trees only through
private classes, and parse at ~40-100 µs per character (greenery, S28-pattern28-1) where this pass costs ~1 µs.
"""

from __future__ import annotations

__all__ = ["PatternUnknown", "expanded_positions", "parse_pattern"]

_MAX_NEST = 200
_SIMPLE = {"n": 10, "t": 9, "r": 13, "f": 12, "v": 11, "a": 7}
_HEX = frozenset("0123456789abcdefABCDEF")
_FLAGS = frozenset("imsUuR-")
_NAME = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_EMPTY = ("e",)
#: a class: (merged code point intervals, Unicode class letters of ``dswDSW``, negated)
Class = tuple[tuple[tuple[int, int], ...], str, bool]


class PatternUnknown(Exception):
    """A construct this parse does not model (the count takes it as over its cap: fail closed)."""


def parse_pattern(text: str) -> tuple[tuple, list[Class]]:
    """``(tree, classes)`` of ``text`` (a pattern as outlines-core inlines it, ``^``/``$`` already dropped): the tree
    of tuples ``("c", class index)`` (a position), ``("cat", [...])``, ``("alt", [...])``, ``("rep", node, m, n or
    None)``, ``("e",)`` (empty: an assertion or nothing). Raises :class:`PatternUnknown` for a construct outside the
    subset (gateway/pattern_states.py's docstring), ``RecursionError`` past deep nesting."""
    parser = _Parser(text)
    return parser.tree(), parser.classes


def expanded_positions(node: tuple, cap: int) -> int:
    """Positions of ``node`` once its counted repetitions are expanded (``e{m,n}``: ``n`` copies; ``e{m,}``:
    ``max(m, 1)``), or ``cap + 1`` once past ``cap``: computed before anything is built."""
    kind = node[0]
    if kind == "c":
        return 1
    if kind == "e":
        return 0
    if kind == "rep":
        inner = expanded_positions(node[1], cap)
        copies = node[3] if node[3] is not None else max(node[2], 1)
        return min(inner * copies, cap + 1)
    total = 0
    for child in node[1]:
        total += expanded_positions(child, cap)
        if total > cap:
            return cap + 1
    return total


class _Parser:
    """One pass over Rust ``regex`` syntax (the subset of the module docstring) into a tree of tuples: ``("c", id)``
    a position of class ``id`` (``classes[id]``: ``(intervals, unicode classes, negated)``), ``("cat", [...])``,
    ``("alt", [...])``, ``("rep", node, m, n or None)``, ``("e",)``. Raises :class:`PatternUnknown`."""

    def __init__(self, text: str) -> None:
        self.t, self.i, self.n = text, 0, len(text)
        self.classes: list[tuple[tuple[tuple[int, int], ...], str, bool]] = []
        self._ids: dict[tuple, int] = {}

    def tree(self) -> tuple:
        node = self._alt([""], 0)
        if self.i != self.n:  # an unbalanced ")"
            raise PatternUnknown
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
            raise PatternUnknown
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
                    raise PatternUnknown
                continue
            while self.i < self.n and t[self.i] in "*+?{":
                c = t[self.i]
                if c == "{":
                    end = t.find("}", self.i)
                    if end < 0:
                        raise PatternUnknown
                    lo, comma, hi = t[self.i + 1:end].partition(",")
                    if not lo.isdecimal() or (hi and not hi.isdecimal()) or len(lo) > 9 or len(hi) > 9:
                        raise PatternUnknown
                    m, top = int(lo), (int(hi) if hi else None) if comma else int(lo)
                    if top is not None and top < m:
                        raise PatternUnknown
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
            raise PatternUnknown
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
                        raise PatternUnknown
                    j = k + 1
                else:
                    k = j
                    while k < self.n and t[k] in _FLAGS:
                        k += 1
                    if k == j or k >= self.n or t[k] not in "):":
                        raise PatternUnknown
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
                raise PatternUnknown
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
                raise PatternUnknown
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
                    raise PatternUnknown
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
            raise PatternUnknown
        return value

    def _escape(self, in_class: bool) -> tuple[str, object]:
        """After ``\\``: ``("c", code point)``, ``("u", "d"...)`` a Unicode class, ``("a", None)`` an assertion."""
        t, i = self.t, self.i
        if i >= self.n:
            raise PatternUnknown
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
                raise PatternUnknown
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
        raise PatternUnknown


def _flags(current: str, spec: str) -> str:
    """``current`` flags after a flag group's ``spec`` (``i-s``); the ``x`` flag is refused before."""
    on, _, off = spec.partition("-")
    return "".join(sorted((set(current) | set(on)) - set(off)))


def _fold(ivs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ivs`` closed under Rust's simple case folding, for ASCII members (``k`` also folds to U+212A, ``s`` to
    U+017F); a member past ASCII raises :class:`PatternUnknown` (not modelled)."""
    out = list(ivs)
    for lo, hi in ivs:
        if hi > 127:
            raise PatternUnknown
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
