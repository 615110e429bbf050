"""The prefix chain's construction, measured against constructions it could have (not a test).

``python -m bench.chain_variants [--prompts 2000] [--tokens 64] [--reps 7] [--name s15-front]``

Session 15 (issue 14, helper "front"). :func:`tenancy.prefix.block_hash_chain` (HMAC-SHA256 per block,
``h_i = HMAC(K, h_{i-1} || block_i)``, from two SHA-256 pad states copied per block: four OpenSSL context
copies per block, two of them inside ``digest()``) against:

* ``hmac-running``: ``h_i = HMAC(K, seed || block_1 || ... || block_i)``: one running inner state updated per
  block, finished by a copy per block (three context copies per block); still HMAC-SHA256 of the prefix;
* ``blake2b-chain``: keyed BLAKE2b (RFC 7693 keyed mode, a PRF; digest 16 bytes), ``h_i = BLAKE2b_K(h_{i-1}
  || block_i)``, one state copy per block (Python's own BLAKE2, a struct copy, no OpenSSL context);
* ``blake2b-running``: keyed BLAKE2b over the running prefix, one ``digest()`` per block.

Each is timed on ``--prompts`` distinct prompts of ``--tokens`` token ids (block size 16, the gateway's),
thread CPU per prompt, best and median of ``--reps`` passes. The variants change the chain's values (and
the design's formula, DESIGN.md "h_i = HMAC(tenant_key, h_{i-1} || block_i)"): a measurement for a design
decision, nothing here is used by the gateway. Results: ``bench/results/chain_variants-<name>.md``.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import struct
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sim.click_options import ClickOptions
from tenancy.prefix import block_hash_chain

RESULTS = Path(__file__).resolve().parent / "results"
BLOCK = 16
_DOMAIN = b"pg-prefix-v1"  # tenancy/prefix.py's seed


_IPAD, _OPAD = bytes(x ^ 0x36 for x in range(256)), bytes(x ^ 0x5C for x in range(256))
_PADS: dict[bytes, tuple[Any, Any]] = {}


def _pads(key: bytes) -> tuple[Any, Any]:
    """HMAC-SHA256's inner and outer pad states of ``key`` (RFC 2104), kept per key as tenancy/prefix.py does."""
    got = _PADS.get(key)
    if got is None:
        padded = key.ljust(64, b"\0")
        got = _PADS[key] = (hashlib.sha256(padded.translate(_IPAD)), hashlib.sha256(padded.translate(_OPAD)))
    return got


def _packed(tokens: Sequence[int]) -> tuple[bytes, int]:
    n = len(tokens) // BLOCK
    return struct.pack(f">{n * BLOCK}I", *tokens[: n * BLOCK]), n


def hmac_running(key: bytes, tokens: Sequence[int], kid: str) -> list[bytes]:
    """HMAC-SHA256 of each prefix (seed, blocks 1..i), 16-byte digests."""
    packed, n = _packed(tokens)
    inner, outer = _pads(key)
    run = inner.copy()
    run.update(_DOMAIN + kid.encode())
    out = []
    for start in range(0, n * 4 * BLOCK, 4 * BLOCK):
        run.update(packed[start:start + 4 * BLOCK])
        o = outer.copy()
        o.update(run.digest())
        out.append(o.digest()[:16])
    return out


def blake2b_chain(keyed: Any, tokens: Sequence[int], kid: str) -> list[bytes]:
    """Keyed BLAKE2b of ``h_{i-1} || block_i`` (``keyed``: the tenant's keyed state, copied per block)."""
    packed, n = _packed(tokens)
    prev, out = _DOMAIN + kid.encode(), []
    for start in range(0, n * 4 * BLOCK, 4 * BLOCK):
        h = keyed.copy()
        h.update(prev)
        h.update(packed[start:start + 4 * BLOCK])
        prev = h.digest()
        out.append(prev)
    return out


def blake2b_running(keyed: Any, tokens: Sequence[int], kid: str) -> list[bytes]:
    """Keyed BLAKE2b of each prefix (seed, blocks 1..i)."""
    packed, n = _packed(tokens)
    h = keyed.copy()
    h.update(_DOMAIN + kid.encode())
    out = []
    for start in range(0, n * 4 * BLOCK, 4 * BLOCK):
        h.update(packed[start:start + 4 * BLOCK])
        out.append(h.digest())
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: prints and writes one Markdown table."""
    ap = ClickOptions("bench.chain_variants", __doc__ or "")
    ap.option("--prompts", type=int, default=2000)
    ap.option("--tokens", type=int, default=64)
    ap.option("--reps", type=int, default=7)
    ap.option("--name", default="s15-front")
    args = ap.parse(argv)
    key = os.urandom(32)
    keyed = hashlib.blake2b(key=key, digest_size=16)
    import hmac  # the running variant is HMAC-SHA256 of the prefix: checked once against the library
    seed = _DOMAIN + b"k1" + struct.pack(f">{2 * BLOCK}I", *range(2 * BLOCK))
    assert hmac_running(key, list(range(2 * BLOCK)), "k1")[1] == hmac.new(key, seed, "sha256").digest()[:16]
    prompts = [list(range(p * args.tokens, (p + 1) * args.tokens)) for p in range(args.prompts)]
    variants: dict[str, Callable[[list[int]], list[bytes]]] = {
        "current (HMAC-SHA256 chain)": lambda t: block_hash_chain(key, t, BLOCK, key_id="k1"),
        "hmac-running": lambda t: hmac_running(key, t, "k1"),
        "blake2b-chain": lambda t: blake2b_chain(keyed, t, "k1"),
        "blake2b-running": lambda t: blake2b_running(keyed, t, "k1"),
    }
    got: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.reps):
        for name, fn in variants.items():  # interleaved: each pass times every variant once
            t = time.thread_time_ns()
            for p in prompts:
                fn(p)
            got[name].append((time.thread_time_ns() - t) / len(prompts) / 1e3)
    lines = [f"# Prefix chain variants (`python -m bench.chain_variants`), {args.prompts} prompts of {args.tokens} "
             f"tokens ({args.tokens // BLOCK} blocks), {args.reps} interleaved passes; µs thread CPU per prompt", "",
             "| variant | best | median |", "|---|---:|---:|"]
    lines += [f"| {k} | {min(v):.2f} | {statistics.median(v):.2f} |" for k, v in got.items()]
    text = "\n".join(lines) + "\n"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"chain_variants-{args.name}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
