"""The newcomer's prefill-room flood (S25-newcomer-1; session 25, fairshare), as a bounded loopback
command: ``--workers`` attacker workers send ``--words``-word prompts (each its own random words: no
prefix hit) for ``--seconds`` s with the attacker tenant's token, honouring its 429 ``Retry-After``
(at most 0.5 s); the victim tenant sends one 50-word request every 0.2 s before (6 s), during and after
(4 s) the flood. Prints and writes (``--out``, JSON) per phase: requests, statuses, median and max
latency (ms, wall, client side) and the attacker's statuses. Against a gateway started from
``prefixgate-sim init``'s configuration and its simulated replicas (docs/benchmarks.md
"Session 25: fairshare")."""

from __future__ import annotations

import asyncio
import collections
import json
import random
import statistics
import time

import click
import httpx


async def one(c: httpx.AsyncClient, url: str, tok: str, words: int) -> tuple[int, float, httpx.Response]:
    s = random.randrange(10**9)
    text = " ".join(f"y{s}_{i}" for i in range(words))
    t = time.perf_counter()
    r = await c.post(url, headers={"Authorization": "Bearer " + tok},
                     json={"model": "sim-model", "max_tokens": 4, "messages": [{"role": "user", "content": text}]})
    return r.status_code, (time.perf_counter() - t) * 1000, r


async def victim(c: httpx.AsyncClient, url: str, tok: str, dur: float, out: list[tuple[int, float]]) -> None:
    end = time.time() + dur
    while time.time() < end:
        st, ms, _ = await one(c, url, tok, 50)
        out.append((st, ms))
        await asyncio.sleep(0.2)


async def attacker(c: httpx.AsyncClient, url: str, tok: str, dur: float, words: int, out: collections.Counter) -> None:
    end = time.time() + dur
    while time.time() < end:
        st, _, r = await one(c, url, tok, words)
        out[st] += 1
        if st == 429:
            ra = float(r.headers.get("retry-after", "0.2") or 0.2)
            await asyncio.sleep(min(ra, 0.5))


def summary(xs: list[tuple[int, float]]) -> dict[str, object]:
    ms = [m for _, m in xs]
    return {"requests": len(xs), "statuses": dict(collections.Counter(s for s, _ in xs)),
            "median_ms": round(statistics.median(ms), 1) if ms else None, "max_ms": round(max(ms), 1) if ms else None}


async def run(url: str, attacker_token: str, victim_token: str, words: int, workers: int, seconds: float,
              out: str | None) -> None:
    """The three phases (module doc); ``*_token``: files holding the tenants' JWT-SVIDs."""
    atk, vic = open(attacker_token).read().strip(), open(victim_token).read().strip()
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=64)) as c:
        base: list[tuple[int, float]] = []
        await victim(c, url, vic, 6, base)
        during: list[tuple[int, float]] = []
        statuses: collections.Counter = collections.Counter()
        await asyncio.gather(victim(c, url, vic, seconds, during),
                             *[attacker(c, url, atk, seconds, words, statuses) for _ in range(workers)])
        after: list[tuple[int, float]] = []
        await victim(c, url, vic, 4, after)
    res = {"baseline": summary(base), "under_flood": summary(during), "attacker_statuses": dict(statuses),
           "after": summary(after), "during_ms": [round(m, 1) for _, m in during]}
    print(json.dumps(res))
    if out:
        with open(out, "w") as f:
            json.dump(res, f, indent=1)


@click.command(help="The prefill-room flood before/during/after (module doc).")
@click.option("--url", default="http://127.0.0.1:8080/v1/chat/completions", show_default=True)
@click.option("--attacker-token", required=True, help="file holding the attacker tenant's JWT-SVID")
@click.option("--victim-token", required=True, help="file holding the victim tenant's JWT-SVID")
@click.option("--words", type=int, default=6000, show_default=True)
@click.option("--workers", type=int, default=16, show_default=True)
@click.option("--seconds", type=float, default=20.0, show_default=True)
@click.option("--out", default=None, help="write the summary here (JSON)")
def main(url: str, attacker_token: str, victim_token: str, words: int, workers: int, seconds: float,
         out: str | None) -> None:
    asyncio.run(run(url, attacker_token, victim_token, words, workers, seconds, out))


if __name__ == "__main__":
    main()
