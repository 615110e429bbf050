"""Session 21 (issue 14, helper tokmemo): in-process thread CPU of the prompt-side work per request
(tokenize with the admission's early-stop ``limit`` + the tenant-keyed block chains of
:class:`gateway.prefix_keys.PrefixKeys`), over public workload rows in arrival order, with the prompt
memo (tenancy/prompt_memo.py) on or off, against another tree (the baseline ``/tmp/s21-base``, an A/A copy).

``python bench/tokmemo_prompt_side.py --trees base=/tmp/s21-base,this=/work/wt-tokmemo,aa=/tmp/s21-aa-tokmemo
--rounds 5 --rows 2000 --out bench/results/tokmemo-s21-prompt-side.md``

Each (round, workload, variant) runs in its own child process (``PYTHONPATH`` = the variant's tree, the
variant's order rotated per round): the rows' prompts are rendered first (:func:`sim.trace.build_prompt`,
what the live grid sends; tenants as the workload gives them), then ``time.thread_time`` is read around
the whole stream: per request ``encode(text, limit)`` then ``prefix_chains(tenant, ids)``, as
gateway/admission_front.py and gateway/pipeline.py call them. Variants: ``<tree>:plain`` (the tokenizer's
``encode``, no memo) and ``<tree>:memo`` (the tenant's memo, default bounds; trees that have it).
``miss-only`` is an adversarial stream: every prompt a fresh text (its first word unique), so nothing
repeats and the memo only costs. Reported: median and min/max over rounds of CPU µs per request, the
memo's hit fraction of tokens. A benchmark, not a test (shared machine: the spread is in the table).

The memo was measured and not landed (bench/results/tokmemo-s21-summary.md): the ``memo`` variants need a
tree of branch ``s21-tokmemo`` at commit 5f9bd9f (``git archive 5f9bd9f | tar -x -C /tmp/memo-tree``); the
``plain`` variants run on any tree. ``TOKMEMO_BYTES`` sets the memo's bytes per tenant (default 1 MiB).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from functools import partial
from types import SimpleNamespace
from typing import Any

import click

PY = sys.executable
WORKLOADS = ("mooncake", "azure-conv+sys", "azure-code+sys", "servegen", "miss-only")
LIMIT = 131072  # tokens: a max_prompt_tokens no row reaches (the early-stop path the gateway takes)


def _rows(workload: str, rows: int) -> tuple[list[str], list[str]]:
    """The prompts and tenants of ``workload`` in arrival order (seed 0)."""
    if workload == "miss-only":
        import random

        rnd = random.Random(21)
        texts = [f"u{i}x{rnd.random()} " + " ".join(f"w{rnd.randrange(10**6)}" for _ in range(rnd.randrange(200, 4000)))
                 for i in range(rows)]
        return texts, ["tenant-a"] * rows
    from sim.trace import build_prompt
    from sim.workloads import WORKLOADS as W

    reqs, tenants = W[workload](0, rows)
    return [build_prompt(r) for r in reqs], list(tenants)


def _measure(workload: str, rows: int, memo: bool, cut: int | None) -> dict[str, Any]:
    """One measurement in this process (its tree on ``PYTHONPATH``)."""
    from gateway.config_routing import RoutingConfig
    from gateway.prefix_keys import PrefixKeys
    from tenancy.keys import KeyRing
    from tenancy.registry import Tenant
    from tenancy.tokenizer import WordTokenizer

    texts, tids = _rows(workload, rows)
    tenants = {t: Tenant(id=t, models=frozenset({"m"})) for t in set(tids)}
    ring, tok, rc = KeyRing(b"tokmemo-s21-bench-master-secret!"), WordTokenizer(), RoutingConfig()
    if memo:
        from gateway.config_tenancy import TenancyConfig
        import tenancy.prompt_memo as pm

        if cut:
            pm.CUT_CHARS = cut
        size = int(os.environ.get("TOKMEMO_BYTES", "0")) or (1 << 20)
        keys = PrefixKeys.from_config(ring, tok, rc, TenancyConfig(prompt_memo={"bytes_per_tenant": size,
                                                                           "entries_per_tenant": 1 << 20}))
        assert keys.memo is not None
        encoders = {t: partial(keys.memo.encode, t) for t in tenants}
    else:
        keys = PrefixKeys(ring, block_size=rc.block_size, max_prefix_blocks=rc.max_prefix_blocks, forward_user=None)
        encoders = {t: tok.encode for t in tenants}
    work = [(encoders[t], tenants[t], x) for x, t in zip(texts, tids)]
    chains = keys.prefix_chains
    blocks = 0
    c0 = time.thread_time()
    for encode, tenant, text in work:
        blocks += len(chains(tenant, encode(text, LIMIT)).current)
    cpu = time.thread_time() - c0
    got = {"us_per_req": cpu / len(work) * 1e6, "rows": len(work), "blocks": blocks}
    if memo:
        c = keys.memo.counts()
        got.update(hit_fraction=c["hit_tokens"] / max(1, c["tokens"]), memo_bytes=c["bytes"], entries=c["entries"])
    return got


@click.command()
@click.option("--worker", nargs=4, type=str, default=None, help="WORKLOAD ROWS MEMO CUT (a child's measurement)")
@click.option("--trees", default="base=/tmp/s21-base,this=/work/wt-tokmemo,aa=/tmp/s21-aa-tokmemo")
@click.option("--variants", default="base:plain,this:plain,this:memo,aa:memo")
@click.option("--workloads", default=",".join(WORKLOADS))
@click.option("--rounds", type=int, default=5)
@click.option("--rows", type=int, default=2000)
@click.option("--cut", type=int, default=0, help="override CUT_CHARS (0: the module's)")
@click.option("--out", default="")
def main(worker: tuple[str, str, str, str] | None, trees: str, variants: str, workloads: str, rounds: int, rows: int,
         cut: int, out: str) -> None:
    """Run the rounds (or, with --worker, one measurement) and print the table."""
    a = SimpleNamespace(worker=worker, trees=trees, variants=variants, workloads=workloads, rounds=rounds, rows=rows,
                      cut=cut, out=out)
    if a.worker:
        w, n, memo, c = a.worker
        print(json.dumps(_measure(w, int(n), memo == "1", int(c) or None)))
        return
    trees = dict(kv.split("=", 1) for kv in a.trees.split(","))
    variants = a.variants.split(",")
    res: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in range(a.rounds):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for w in a.workloads.split(","):
            for v in order:
                tree, mode = v.split(":")
                env = dict(os.environ, PYTHONPATH=trees[tree])
                out = subprocess.run([PY, os.path.abspath(__file__), "--worker", w, str(a.rows),
                                      "1" if mode == "memo" else "0", str(a.cut)],
                                     env=env, capture_output=True, text=True, timeout=600, cwd=trees[tree])
                if out.returncode:
                    raise SystemExit(out.stderr)
                res.setdefault((w, v), []).append(json.loads(out.stdout))
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr, flush=True)
    lines = [f"rows {a.rows}, rounds {a.rounds}, cut {a.cut or 'default'}, limit {LIMIT}; CPU us per request "
             "(thread_time over the stream / rows): median [min, max] over rounds", "",
             "| workload | variant | us/req median | [min, max] | hit fraction of tokens | memo bytes |",
             "|---|---|---:|---|---:|---:|"]
    for w in a.workloads.split(","):
        for v in variants:
            runs = res[(w, v)]
            us = [x["us_per_req"] for x in runs]
            hit = runs[0].get("hit_fraction")
            lines.append(f"| {w} | {v} | {statistics.median(us):.1f} | [{min(us):.1f}, {max(us):.1f}] | "
                         f"{'' if hit is None else f'{hit:.3f}'} | {runs[0].get('memo_bytes', '')} |")
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
