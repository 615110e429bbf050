"""Micro-benchmark: the per-request hot path of a long prompt, before vs after session 3 (not a test).

``python -m bench.hotpath_micro [--tokens 8000] [--reps 7] [--name s3]``

For one prompt of ``--tokens`` word-tokenizer tokens (two texts: the replay's simulator prompt,
words ``b{id}w{j}`` built from the first Mooncake rows, and a prose-like text with punctuation),
the best of ``--reps`` repetitions, in ms per prompt (thread CPU time):

* ``WordTokenizer.encode``: before (per-token Python loop, a 32-bit BLAKE2b digest per token, kept
  here as :func:`encode_before`) vs now (``map(zlib.crc32, ...)``, ASCII texts scanned as bytes;
  both texts are ASCII, so a non-ASCII text is also timed: the prose with one "é"); the regex scan alone
  (``findall``) and the measured pattern variants (only those giving identical token strings may
  replace the pattern; which do is printed).
* ``block_hash_chain`` (block size 16): before (:func:`chain_before`: ``hmac`` copy/update/digest
  and a ``struct.pack`` per block) vs now; also the one-shot ``hmac.digest`` per block variant.
* ids: ``str(uuid.uuid4())`` + ``uuid.uuid4().hex`` vs :mod:`audit.ids`, per request (one event
  id and one request id), alone and while another thread is busy in Python (the GIL is released
  around each ``getrandom`` system call of ``uuid4``: wall time per request then includes waiting
  to get it back).

Results: ``bench/results/hotpath_micro-<name>.json`` and ``.md``.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import random
import re
import statistics
import struct
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from audit.ids import uuid4_hex, uuid4_str
from sim.click_options import ClickOptions
from sim.trace import DEFAULT_TRACE_PATH, build_prompt, load_mooncake
from tenancy.prefix import block_hash_chain
from tenancy.tokenizer import _ASCII_TOKEN_RE, _TOKEN_RE, MAX_TOKEN_CHARS, WordTokenizer

RESULTS = Path(__file__).resolve().parent / "results"
PROBE = " " * 70 + "w" + "\x1c" * 66 + "z" * 70 + " ." + "\t" * 65  # ASCII; long blank runs and a long word
PATTERNS = {
    "current": _TOKEN_RE.pattern,
    "possessive word": r"\w{1,64}+|[^\w\s]|\s{65,}",
    "atomic group": r"(?>\w{1,64}|[^\w\s]|\s{65,})",
    "skip short blanks (group)": r"(?:\s{1,64}(?!\s))?(\w{1,64}|[^\w\s]|\s{65,})",
    "unbounded word": r"\w+|[^\w\s]|\s{65,}",
    "no long-blank alternative": r"\w{1,64}|[^\w\s]",
    "leading \\s* (group)": r"\s*(\w{1,64}|[^\w\s])",
}


def encode_before(text: str, limit: int | None = None) -> list[int]:
    """``WordTokenizer.encode`` as of issue 14 (ids: BLAKE2b-32 per token in a Python loop)."""
    stop = None if limit is None else max(0, limit) + 1
    if stop is None or len(text) <= MAX_TOKEN_CHARS * stop:
        found = _TOKEN_RE.findall(text)
    else:
        found = [m.group() for m in itertools.islice(_TOKEN_RE.finditer(text), stop)]
    if stop is not None:
        del found[stop:]
    blake2b, from_bytes = hashlib.blake2b, int.from_bytes
    local: dict[str, int] = {}
    out: list[int] = []
    for piece in found:
        v = local.get(piece)
        if v is None:
            v = local[piece] = from_bytes(blake2b(piece.encode("utf-8"), digest_size=4).digest(), "big")
        out.append(v)
    return out


def chain_before(key: bytes, tokens: list[int], block_size: int, key_id: str = "") -> list[bytes]:
    """``block_hash_chain`` before session 3 (an ``hmac`` object copied per block)."""
    n = len(tokens) // block_size
    fmt = f">{block_size}I"
    prev = b"pg-prefix-v1" + key_id.encode("utf-8")
    base = hmac.new(key, digestmod=hashlib.sha256)
    out: list[bytes] = []
    for i in range(n):
        h = base.copy()
        h.update(prev)
        h.update(struct.pack(fmt, *tokens[i * block_size: (i + 1) * block_size]))
        prev = h.digest()[:16]
        out.append(prev)
    return out


def chain_oneshot(key: bytes, tokens: list[int], block_size: int, key_id: str = "") -> list[bytes]:
    """A variant: ids packed once, one-shot ``hmac.digest`` per block (measured, not kept)."""
    n = len(tokens) // block_size
    packed = struct.pack(f">{n * block_size}I", *tokens[: n * block_size])
    width = 4 * block_size
    prev = b"pg-prefix-v1" + key_id.encode("utf-8")
    out: list[bytes] = []
    for s in range(0, n * width, width):
        prev = hmac.digest(key, prev + packed[s:s + width], "sha256")[:16]
        out.append(prev)
    return out


def best_ms(fn: Callable[[], Any], reps: int, number: int) -> float:
    """Best of ``reps`` runs of ``number`` calls, thread CPU ms per call."""
    times = []
    for _ in range(reps):
        t0 = time.thread_time()
        for _ in range(number):
            fn()
        times.append((time.thread_time() - t0) / number)
    return round(1e3 * min(times), 4)


def wall_ms_contended(fn: Callable[[], Any], number: int) -> float:
    """Wall ms per call of ``fn`` while another thread spins in Python (GIL contention)."""
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            x += 1

    t = threading.Thread(target=spin, daemon=True)
    t.start()
    try:
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        return round(1e3 * (time.perf_counter() - t0) / number, 4)
    finally:
        stop.set()
        t.join()


def texts(tokens: int) -> dict[str, str]:
    """The benchmark prompts, each exactly ``tokens`` word-tokenizer tokens."""
    words: list[str] = []
    for req in load_mooncake(DEFAULT_TRACE_PATH, 300):
        words.extend(build_prompt(req).split())
        if len(words) >= tokens:
            break
    rnd = random.Random(0)
    # prose-like: 3000 made-up words drawn Zipf-like (weight 1/rank), with punctuation and line breaks
    syll = ["ka", "lo", "mi", "tre", "sun", "pa", "ve", "ro", "di", "qua", "ne", "st", "or"]
    vocab = ["".join(rnd.choices(syll, k=rnd.randint(1, 4))) for _ in range(3000)]
    vocab += [",", ".", "(", ")", "don't", "3.14", "x_1", ":", "\n", "\n\n"] * 40
    weights = [1 / (i + 1) for i in range(len(vocab))]
    rnd.shuffle(vocab)
    prose = " ".join(rnd.choices(vocab, weights, k=2 * tokens))
    cut = [m.end() for m in itertools.islice(_TOKEN_RE.finditer(prose), tokens)][-1]
    # the same prose with one no-break space (a \\s, not ASCII): the str scan, same tokens
    prose = prose[:cut]
    return {"sim": " ".join(words[:tokens]), "prose": prose, "prose-nonascii": prose.replace(" ", "\u00a0", 1)}


def run(tokens: int, reps: int) -> dict[str, Any]:
    """All measurements (module doc) as one JSON-able dict."""
    out: dict[str, Any] = {"tokens": tokens, "reps": reps, "unit": "ms per prompt (thread CPU), best of reps"}
    tok = WordTokenizer()
    for name, text in texts(tokens).items():
        found = _TOKEN_RE.findall(text)
        assert len(found) == tokens and encode_before(text) != tok.encode(text)
        row: dict[str, Any] = {
            "encode_before": best_ms(lambda: encode_before(text), reps, 20),
            "encode_now": best_ms(lambda: tok.encode(text), reps, 20),
            "encode_now_limit": best_ms(lambda: tok.encode(text, tokens), reps, 20),
        }
        pats = {}
        # "identical": the same token strings on the text and on it plus long blank runs and words
        probed = text + PROBE
        want = _TOKEN_RE.findall(probed)
        for label, pat in PATTERNS.items():
            rx = re.compile(pat)
            pats[label] = {"ms": best_ms(lambda: rx.findall(text), reps, 20), "identical": rx.findall(probed) == want}
        if text.isascii():
            pats["ascii bytes scan (kept)"] = {
                "ms": best_ms(lambda: _ASCII_TOKEN_RE.findall(text.encode("ascii")), reps, 20),
                "identical": [b.decode() for b in _ASCII_TOKEN_RE.findall(probed.encode("ascii"))] == want}
        row["findall"] = pats
        out[f"tokenize_{name}"] = row
    ids = tok.encode(texts(tokens)["sim"])
    key = bytes(range(32))
    assert chain_before(key, ids, 16, "t:a:v1") == block_hash_chain(key, ids, 16, key_id="t:a:v1") \
        == chain_oneshot(key, ids, 16, "t:a:v1")
    out["chain_block16"] = {
        "before": best_ms(lambda: chain_before(key, ids, 16, "t:a:v1"), reps, 20),
        "now": best_ms(lambda: block_hash_chain(key, ids, 16, key_id="t:a:v1"), reps, 20),
        "oneshot_hmac_digest": best_ms(lambda: chain_oneshot(key, ids, 16, "t:a:v1"), reps, 20),
    }

    def ids_before() -> None:
        str(uuid.uuid4())
        uuid.uuid4().hex

    def ids_now() -> None:
        uuid4_str()
        uuid4_hex()

    out["ids_per_request"] = {
        "before_cpu": best_ms(ids_before, reps, 5000),
        "now_cpu": best_ms(ids_now, reps, 5000),
        "before_wall_contended": statistics.median(wall_ms_contended(ids_before, 200) for _ in range(reps)),
        "now_wall_contended": statistics.median(wall_ms_contended(ids_now, 200) for _ in range(reps)),
    }
    return out


def markdown(res: dict[str, Any]) -> str:
    """The results as a Markdown report."""
    lines = [f"# Hot-path micro-benchmark ({res['tokens']} tokens per prompt; {res['unit']})", ""]
    lines += ["| piece | before | now |", "|---|---:|---:|"]
    for name in ("sim", "prose", "prose-nonascii"):
        r = res[f"tokenize_{name}"]
        lines.append(f"| `WordTokenizer.encode`, {name} text | {r['encode_before']} | {r['encode_now']} "
                     f"(with limit: {r['encode_now_limit']}) |")
    c = res["chain_block16"]
    lines.append(f"| `block_hash_chain`, block 16 | {c['before']} | {c['now']} (one-shot `hmac.digest`: "
                 f"{c['oneshot_hmac_digest']}) |")
    i = res["ids_per_request"]
    lines.append(f"| event id + request id, CPU | {i['before_cpu']} | {i['now_cpu']} |")
    lines.append(f"| event id + request id, wall with a busy thread | {i['before_wall_contended']} "
                 f"| {i['now_wall_contended']} |")
    lines += ["", "Regex scan alone (`findall`), ms; identical = same token strings as the current pattern",
              "(on the text plus long blank runs and a long word; the kept patterns are also property-tested):", "",
              "| pattern | sim | prose | identical |", "|---|---:|---:|---|"]
    for label in res["tokenize_sim"]["findall"]:
        s, p = res["tokenize_sim"]["findall"][label], res["tokenize_prose"]["findall"][label]
        pat = PATTERNS.get(label, _ASCII_TOKEN_RE.pattern.decode())
        lines.append(f"| {label} `{pat}` | {s['ms']} | {p['ms']} | {s['identical'] and p['identical']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """CLI entry point (module doc)."""
    ap = ClickOptions(prog="python -m bench.hotpath_micro", description=__doc__)
    ap.option("--tokens", type=int, default=8000)
    ap.option("--reps", type=int, default=7)
    ap.option("--name", default="s3")
    args = ap.parse()
    res = run(args.tokens, args.reps)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"hotpath_micro-{args.name}.json").write_text(json.dumps(res, indent=1) + "\n")
    text = markdown(res)
    (RESULTS / f"hotpath_micro-{args.name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
