"""Offline prefix-cache hit-rate bounds for a trace replay.

Both bounds run on the simulator's own block keys: the prompt built by
:func:`sim.trace.build_prompt` is tokenized with
:class:`tenancy.tokenizer.WordTokenizer`, cut into full ``block_size``-token
KV blocks (a trailing partial block is never cached, as in vLLM's automatic
prefix caching and :mod:`tenancy.prefix`), and each block gets a chained key
covering its whole prefix and the tenant (cache salt), so tenants never share
blocks. Requests are processed in trace order; a request's hit is the number
of leading blocks already cached times ``block_size`` tokens (not capped: a
full-prompt hit counts fully), after which all of its full blocks are
inserted (the request's own blocks never count as hits for itself).

* oracle: one cache without limit - the most any router could reach;
* pooled: one LRU cache holding every replica's capacity together
  (``replicas * capacity_blocks``) - what perfect placement over the same
  total memory could reach, ignoring load.

Both are token-weighted: ``sum(hit tokens) / sum(prompt tokens)`` in
simulator tokens (prompt tokens include the uncacheable partial tail).

Reproduction (one tenant, 32 simulator tokens per 512-token trace block,
first 2000 rows, 6 replicas x 4000 blocks): see docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from sim.trace import DEFAULT_TRACE_PATH, TraceRequest, assign_tenants, build_prompt, load_mooncake
from tenancy.tokenizer import WordTokenizer

__all__ = ["HitRateBounds", "request_block_keys", "oracle_hit_rate", "pooled_lru_hit_rate", "compute_bounds", "main"]


@dataclass(frozen=True, slots=True)
class HitRateBounds:
    """Token-weighted hit-rate bounds (fractions in 0..1) and their setting."""

    oracle: float
    pooled: float
    rows: int
    replicas: int
    capacity_blocks: int
    block_size: int
    tenants: int
    prompt_tokens: int


def request_block_keys(tokens: Sequence[int], block_size: int, salt: str) -> list[bytes]:
    """Return chained keys of the full ``block_size``-token blocks of ``tokens`` under ``salt``.

    ``k_i = BLAKE2b-128(k_{i-1} || block_i)`` with ``k_0 = BLAKE2b-128(salt)``;
    equal keys mean equal salt and equal whole prefix.
    """
    prev = hashlib.blake2b(salt.encode("utf-8"), digest_size=16).digest()
    out: list[bytes] = []
    for i in range(len(tokens) // block_size):
        h = hashlib.blake2b(prev, digest_size=16)
        h.update(b"".join(t.to_bytes(4, "big") for t in tokens[i * block_size : (i + 1) * block_size]))
        prev = h.digest()
        out.append(prev)
    return out


def oracle_hit_rate(requests: Sequence[tuple[int, list[bytes]]], block_size: int) -> float:
    """Hit rate of one unbounded cache; ``requests`` are ``(prompt_tokens, block_keys)`` in order."""
    seen: set[bytes] = set()
    hit = total = 0
    for ntok, keys in requests:
        total += ntok
        n = 0
        for k in keys:
            if k not in seen:
                break
            n += 1
        hit += n * block_size
        seen.update(keys)
    return hit / total if total else 0.0


def pooled_lru_hit_rate(requests: Sequence[tuple[int, list[bytes]]], block_size: int, capacity_blocks: int) -> float:
    """Hit rate of one LRU cache of ``capacity_blocks`` blocks; same input as :func:`oracle_hit_rate`.

    A request's leading cached blocks count as hits; then all its blocks are
    touched/inserted in prefix order and least-recently-used blocks evicted.
    """
    if capacity_blocks <= 0:
        raise ValueError("capacity_blocks must be positive")
    lru: OrderedDict[bytes, None] = OrderedDict()
    hit = total = 0
    for ntok, keys in requests:
        total += ntok
        n = 0
        for k in keys:
            if k not in lru:
                break
            n += 1
        hit += n * block_size
        for k in keys:
            if k in lru:
                lru.move_to_end(k)
            else:
                lru[k] = None
        while len(lru) > capacity_blocks:
            lru.popitem(last=False)
    return hit / total if total else 0.0


def trace_block_keys(
    reqs: Sequence[TraceRequest], tenants: Sequence[str], block_size: int
) -> list[tuple[int, list[bytes]]]:
    """Return ``(prompt_tokens, block_keys)`` per request, salted by its tenant (parallel lists)."""
    tok = WordTokenizer()
    out: list[tuple[int, list[bytes]]] = []
    for req, tenant in zip(reqs, tenants, strict=True):
        ids = tok.encode(build_prompt(req))
        out.append((len(ids), request_block_keys(ids, block_size, tenant)))
    return out


def compute_bounds(
    reqs: Sequence[TraceRequest],
    *,
    replicas: int,
    capacity_blocks: int,
    block_size: int = 16,
    tenants: Sequence[str] = ("tenant-a",),
    seed: int = 0,
) -> HitRateBounds:
    """Compute both bounds for ``reqs`` with tenants assigned by :func:`sim.trace.assign_tenants`."""
    assigned = assign_tenants(reqs, tenants, seed)
    keyed = trace_block_keys(reqs, assigned, block_size)
    return HitRateBounds(
        oracle=oracle_hit_rate(keyed, block_size),
        pooled=pooled_lru_hit_rate(keyed, block_size, replicas * capacity_blocks),
        rows=len(reqs),
        replicas=replicas,
        capacity_blocks=capacity_blocks,
        block_size=block_size,
        tenants=len(tenants),
        prompt_tokens=sum(n for n, _ in keyed),
    )


def tenant_names(n: int) -> list[str]:
    """Return ``n`` demo tenant ids: tenant-a, tenant-b, ..."""
    if not 1 <= n <= 26:
        raise ValueError("tenants must be within 1..26")
    return [f"tenant-{chr(ord('a') + i)}" for i in range(n)]


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: ``python -m sim.bounds --rows 2000 --replicas 6 --capacity-blocks 4000 --tenants 1``."""
    ap = argparse.ArgumentParser(prog="python -m sim.bounds", description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE_PATH)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--replicas", type=int, default=6)
    ap.add_argument("--capacity-blocks", type=int, default=4000, help="KV blocks per replica")
    ap.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    ap.add_argument("--tenants", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = ap.parse_args(argv)
    b = compute_bounds(
        load_mooncake(args.trace, args.rows),
        replicas=args.replicas,
        capacity_blocks=args.capacity_blocks,
        block_size=args.block_size,
        tenants=tenant_names(args.tenants),
        seed=args.seed,
    )
    if args.json:
        print(json.dumps(asdict(b)))
    else:
        print(f"oracle (unbounded) hit rate: {b.oracle:.3f}")
        print(f"pooled LRU bound ({b.replicas} x {b.capacity_blocks} blocks): {b.pooled:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
