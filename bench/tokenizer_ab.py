"""In-process A/B of ``WordTokenizer.encode``: this tree against another tree's (not a test).

``python -m bench.tokenizer_ab --baseline /tmp/s9-base [--rounds 15] [--number 2000] [--name s9-core]``

The baseline's ``tenancy/tokenizer.py`` is loaded under another module name in the same process
(its absolute imports resolve to this tree's modules), and A (baseline), B (this tree) and A' (the
baseline again: the A/A noise) run alternately, ``--rounds`` rounds of ``--number`` calls per text;
thread-CPU µs per call, medians of the rounds and the median of the per-round B − A and A' − A
differences. Texts: the overhead bench's 64-word prompt (words and blanks), 64-word ASCII prose with
punctuation, a rendered two-message chat of that prose, the prose with one "é" (Latin-1), and two
texts outside Latin-1 (CJK; English with an em dash and curly quotes).
Results: ``bench/results/tokenizer_ab-<name>.md`` (and printed).
"""

from __future__ import annotations

import importlib.util
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import click

from sim.click_options import ClickOptions

from tenancy.tokenizer import WordTokenizer, render_chat

RESULTS = Path(__file__).resolve().parent / "results"


def _load(tree: str) -> Callable[[str, int | None], list[int]]:
    spec = importlib.util.spec_from_file_location("base_tokenizer", Path(tree) / "tenancy" / "tokenizer.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.WordTokenizer().encode


def _prose(rng: random.Random, n: int = 64) -> str:
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(400)]
    out = []
    for i in range(n):
        w = rng.choice(vocab)
        w = w.capitalize() if i % 9 == 0 else w
        r = rng.random()
        w = w + "," if r < 0.08 else w + "." if r < 0.12 else "(" + w + ")" if r < 0.13 else w + "'s" if r < 0.15 else w
        out.append(w)
    return " ".join(out)


def texts() -> dict[str, str]:
    """The texts timed, by name."""
    rng = random.Random(9)
    prose = _prose(rng)
    return {
        "bench 64 words": " ".join(f"w{rng.randrange(10**6)}x{j}" for j in range(64)),
        "prose 64 words": prose,
        "chat (2 messages)": render_chat([{"role": "system", "content": _prose(rng, 16)},
                                          {"role": "user", "content": prose}]),
        "prose + é": prose + " café",
        "CJK with punctuation": "日本語のテキスト、句読点あり。" * 10,
        "English + em dash and curly quotes": "Hello, world — “quoted” text with an em dash. " * 8,
    }


def _cpu_us(fn: Callable[[str, int | None], list[int]], text: str, number: int) -> float:
    t0 = time.thread_time_ns()
    for _ in range(number):
        fn(text, 8192)
    return (time.thread_time_ns() - t0) / number / 1e3


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    ap = ClickOptions(prog="python -m bench.tokenizer_ab", description=__doc__.splitlines()[0])
    ap.option("--baseline", type=click.Path(path_type=Path), required=True)
    ap.option("--rounds", type=int, default=15)
    ap.option("--number", type=int, default=2000, help="calls per text and round")
    ap.option("--name", default="s9-core")
    a = ap.parse(argv)
    base, this = _load(str(a.baseline)), WordTokenizer().encode
    lines = [f"# WordTokenizer.encode, in-process A/B (`python -m bench.tokenizer_ab`, baseline {a.baseline})", "",
             f"Thread-CPU µs per call, {a.rounds} rounds of {a.number} calls per text, A B A' alternating; "
             f"load average {os.getloadavg()[0]:.1f} at the end.", "",
             "| text | A base µs | B this µs | median B − A | A' − A (A/A) | rounds B < A |", "|---|---:|---:|---:|---:|---|"]
    for name, text in texts().items():
        assert base(text, 8192) == this(text, 8192), name
        ra, rb, ra2 = [], [], []
        for _ in range(a.rounds):
            ra.append(_cpu_us(base, text, a.number))
            rb.append(_cpu_us(this, text, a.number))
            ra2.append(_cpu_us(base, text, a.number))
        d = [b - x for b, x in zip(rb, ra)]
        d0 = [y - x for y, x in zip(ra2, ra)]
        lines.append(f"| {name} | {statistics.median(ra):.2f} | {statistics.median(rb):.2f} | "
                     f"{statistics.median(d):+.2f} | {statistics.median(d0):+.2f} | {sum(x < 0 for x in d)} of {a.rounds} |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"tokenizer_ab-{a.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
