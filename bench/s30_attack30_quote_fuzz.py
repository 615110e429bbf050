"""Session 30 (attack30, S30-attack30-3): a differential of gateway/pattern_quote.py's verdict against outlines-core's
own automaton. Random patterns are drawn from a list of regex pieces (flags, escapes, classes, groups, quantifiers,
non-ASCII); each the scan calls quote-free is built as ``{"type": "string", "pattern": p}`` by outlines-core 0.2.14
(``build_regex_from_schema``, ``Index`` over one token per character: printable ASCII, ``\\n``, ``\\t`` and six
non-ASCII characters) in one child process limited to 3 GiB; the child reports a pattern whose automaton starts with
anything but ``"`` or can read a ``"`` that is not the last character ("MISMATCH"), or that outlines-core refuses
("error": nothing to bound). Text on stdout; exit status 1 on a mismatch.

outlines-core is not a project dependency: ``OUTLINES_PYTHON`` names an interpreter that has it. Usage:
``OUTLINES_PYTHON=/tmp/oc-venv/bin/python python -m bench.s30_attack30_quote_fuzz [SEED [COUNT]]``.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter

from gateway.pattern_quote import pattern_reads_quote

_CHILD = r'''
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from outlines_core import Index, Vocabulary
from outlines_core.json_schema import build_regex_from_schema
alphabet = [chr(c) for c in range(32, 127)] + ["\n", "\t", "\u00e9", "\u00a0", "\u2028", "\u017f", "\u212a", "\uff02"]
tokens = {c: [i] for i, c in enumerate(alphabet)}
n, q = len(alphabet), tokens['"'][0]
vocab = Vocabulary(n + 1, tokens)
out = []
for line in sys.stdin:
    p = json.loads(line)
    try:
        idx = Index(build_regex_from_schema(json.dumps({"type": "string", "pattern": p})), vocab)
    except BaseException:
        out.append([p, "error"])
        continue
    tr, s0 = idx.get_transitions(), idx.get_initial_state()
    verdict = "ok"
    if any(t != q for t in tr.get(s0, {}) if t < n):
        verdict = "starts without a quote"
    todo = [tr[s0][q]] if verdict == "ok" and q in tr.get(s0, {}) else []
    seen = set(todo)
    while todo and verdict == "ok":
        for t, nxt in tr.get(todo.pop(), {}).items():
            if t == q and any(u < n for u in tr.get(nxt, {})):
                verdict = "reads a quote inside"
                break
            if t < n and t != q and nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    out.append([p, verdict])
print(json.dumps(out))
'''

#: the pieces a random pattern is drawn from (1-6 of them)
PIECES = ['a', 'b', '"', '\\"', '.', '\\d', '\\D', '\\s', '\\S', '\\w', '\\W', '[^a]', '[a-z]', '[!-#]', '[^"]',
          '[^"a]', '\\x22', '\\x{22}', '\\u0022', '(?i)', '(?s)', '(?-u)', '(?U)', '(?R)', '(?m)', '(?x)', '(', ')',
          '(?:', '|', '*', '+', '?', '{1,3}', '{2}', '{ 2}', '^', '$', '\\\\', '[', ']', '-', '\\b', '\\B', '\\A',
          '\\z', ' ', '#', '\\n', '\\t', '\\pL', '\\p{L}', '\\PL', '[[:alpha:]]', '[a&&b]', '[\\d--5]', '(?P<n>',
          '(?<n>', '\\<', '\\>', '\\b{start}', '[\\x00-\\x7f]', '[^\\x00-\\x21]', '[^\\x23-\\x7f]', '[^\\D]', '[^\\S]',
          '[^\\W]', '[^\\d\\s]', '[\\s\\S]', '[^-]', '[]a]', '[^]a]', '[a-]', '[#-~]', '(?i:', '(?-i:', '(?s:.)',
          '\\.', '\\-', '\\[', '\\]', '\\(', '\\)', '\\|', '\\$', '\\^', '\\{', '\\}', '\\*', '\\+', '\\?', '\\/',
          '\\#', '\\&', '\\~', '\\ ', '\\e', '\\0', '\\v', '\\f', '\\r', '\\a', '\u00e9', '\uff02', '\u212a',
          '(?i)\u017f', '[\u00e9-\uffff]', '[\\u{20}-\\u{21}]', '[\\U00000023-\\U0010FFFF]', '\\X', '\\K', '\\h',
          '[\\p{L}]', '[^\\p{L}]', '\\N{QUOTATION MARK}', '\\c"']


def main() -> int:
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    rng = random.Random(seed)
    patterns: set[str] = set()
    while len(patterns) < count:
        patterns.add("".join(rng.choice(PIECES) for _ in range(rng.randint(1, 6))))
    free = [p for p in sorted(patterns) if not pattern_reads_quote(p)]
    child = subprocess.run([os.environ.get("OUTLINES_PYTHON", "python3"), "-c", _CHILD],
                           input="\n".join(json.dumps(p) for p in free), capture_output=True, text=True, timeout=1800)
    if child.returncode != 0:
        print(f"child failed (rc {child.returncode}): {child.stderr[-300:]}")
        return 2
    results = json.loads(child.stdout)
    print(f"seed {seed}: {count} patterns, {len(free)} quote-free by the scan; outlines-core:",
          dict(Counter(v for _, v in results)))
    bad = [(p, v) for p, v in results if v not in ("ok", "error")]
    for p, v in bad:
        print("MISMATCH", json.dumps(p), v)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
