"""outlines-core's ``Index`` (the automaton a replica builds from a JSON schema before the first token) measured in a
bounded child process: the one runner of bench/s28_attack28_outlines_index.py and bench/s29_pattern29_quote_index.py.

outlines-core is not a project dependency: ``python`` names an interpreter that has it (``pip install
outlines-core==0.2.14`` in a scratch venv). The child is limited to 3 GiB of address space and 60 s of CPU.
"""

from __future__ import annotations

import json
import subprocess

__all__ = ["index_in_child"]

_CHILD = r'''
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
resource.setrlimit(resource.RLIMIT_CPU, (60, 60))
from outlines_core import Index, Vocabulary
from outlines_core.json_schema import build_regex_from_schema
regex = build_regex_from_schema(sys.stdin.read())
tokens = {c: [i] for i, c in enumerate(json.loads(sys.argv[1]))}
t = time.process_time()
Index(regex, Vocabulary(len(tokens) + 1, tokens))
print(json.dumps({"regex": len(regex), "index_s": round(time.process_time() - t, 3),
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}))
'''


def index_in_child(schema_json: str, python: str, alphabet: list[str], timeout_s: float) -> str:
    """Build outlines-core's ``Index`` for ``schema_json`` (a JSON schema's text) over a vocabulary of one token per
    character of ``alphabet`` in a child run by ``python``; the child's JSON line (``regex`` characters,
    ``index_s`` CPU seconds, ``rss_mb`` peak MiB), or what stopped it: ``killed (rc N: ...)`` past 60 s of CPU or
    3 GiB, ``not finished in T s wall`` past ``timeout_s`` seconds (a loaded machine). Raises nothing else."""
    try:
        p = subprocess.run([python, "-c", _CHILD, json.dumps(alphabet)], input=schema_json, capture_output=True,
                           text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"not finished in {timeout_s:g} s wall"
    return p.stdout.strip() or f"killed (rc {p.returncode}: 60 s CPU or 3 GiB)"
