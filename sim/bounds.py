"""Offline prefix-cache hit-rate bounds for a trace replay.

Both bounds run on the simulator's own block keys
(:func:`sim.kvcache.block_keys`): the prompt built by
:func:`sim.trace.build_prompt` is tokenized with
:class:`tenancy.tokenizer.WordTokenizer`, cut into full ``block_size``-token
KV blocks (a trailing partial block is never cached, as in vLLM's automatic
prefix caching), and each block's key chains its whole prefix and the
tenant's cache salt (here the tenant id), so tenants never share blocks. Requests are processed in trace order; a request's hit is the number
of leading blocks already cached times ``block_size`` tokens (not capped: a
full-prompt hit counts fully), after which all of its full blocks are
inserted (the request's own blocks never count as hits for itself). Unlike
the live simulator, insertion is immediate: a request sees every earlier
request's blocks even if that one had not finished its prefill yet.

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

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import click

from sim.click_options import ClickOptions
from sim.kvcache import BlockCache, block_keys
from sim.trace import DEFAULT_TRACE_PATH, TraceRequest, assign_tenants, build_prompt, load_mooncake
from tenancy.tokenizer import WordTokenizer

__all__ = ["HitRateBounds", "trace_block_keys", "oracle_hit_rate", "pooled_lru_hit_rate", "compute_bounds", "main"]


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
    """Hit rate of one :class:`sim.kvcache.BlockCache` of ``capacity_blocks`` blocks.

    Same input as :func:`oracle_hit_rate`. A request's leading cached blocks
    count as hits, then all its blocks are inserted with the simulator's own
    LRU semantics (touched tail-first, so a shared head outlives the deep
    tails). Raises :class:`ValueError` for a non-positive capacity.
    """
    if capacity_blocks <= 0:
        raise ValueError("capacity_blocks must be positive")
    cache = BlockCache(capacity_blocks)
    hit = total = 0
    for ntok, keys in requests:
        total += ntok
        hit += cache.match(keys) * block_size
        cache.insert(keys)
    return hit / total if total else 0.0


def trace_block_keys(
    reqs: Sequence[TraceRequest], tenants: Sequence[str], block_size: int
) -> list[tuple[int, list[bytes]]]:
    """Return ``(prompt_tokens, block_keys)`` per request, salted by its tenant (parallel lists)."""
    tok = WordTokenizer()
    out: list[tuple[int, list[bytes]]] = []
    for req, tenant in zip(reqs, tenants, strict=True):
        ids = tok.encode(build_prompt(req))
        out.append((len(ids), block_keys(ids, block_size, tenant)))
    return out


def compute_bounds(
    reqs: Sequence[TraceRequest],
    *,
    replicas: int,
    capacity_blocks: int,
    block_size: int = 16,
    tenants: Sequence[str] = ("tenant-a",),
    seed: int = 0,
    assigned: Sequence[str] | None = None,
) -> HitRateBounds:
    """Compute both bounds for ``reqs`` with tenants assigned by :func:`sim.trace.assign_tenants`,
    or, when ``assigned`` (one tenant per request, parallel to ``reqs``) is given, with those
    (``tenants`` then only names the distinct tenants counted in the result). Raises
    :class:`ValueError` if ``assigned`` is not parallel to ``reqs``."""
    if assigned is None:
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
    ap = ClickOptions(prog="python -m sim.bounds", description=__doc__.split("\n\n")[0])
    ap.option("--trace", type=click.Path(path_type=Path), default=DEFAULT_TRACE_PATH)
    ap.option("--rows", type=int, default=2000)
    ap.option("--replicas", type=int, default=6)
    ap.option("--capacity-blocks", type=int, default=4000, help="KV blocks per replica")
    ap.option("--block-size", type=int, default=16, help="tokens per KV block")
    ap.option("--tenants", type=int, default=1)
    ap.option("--seed", type=int, default=0)
    ap.option("--json", is_flag=True, help="print JSON instead of text")
    args = ap.parse(argv)
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
