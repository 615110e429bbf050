"""The gating stages before routing, warm and in-process, this tree vs another, interleaved (not a test).

``python -m bench.gate_stages --baseline DIR [--rounds 6] [--requests 2000] [--stage auth ...]``

Session 13 (issue 14). Each round runs one fresh ``python`` process per tree (``PYTHONPATH`` = the
tree, the two alternating, order reversed every other round) that builds a real
:class:`gateway.build.Gateway` from the benchmark's demo configuration (:func:`sim.demo.gateway_config`:
JWT-SVID, embedded OPA, HMAC chain; not started, no socket) and times, warm, each stage on
``--requests`` distinct 64-word ``/v1/completions`` bodies (one tenant, one JWT-SVID reused, so
verified-token and decision-cache hits, as in ``bench.overhead``):

* ``auth``: ``Authenticator.authenticate`` of a Starlette ``Request`` (built per call);
* ``parse``: ``parse_inference_request`` with the tenant's bounds;
* ``tokenize``: ``Admission.prompt_tokens`` (the default ``word`` tokenizer);
* ``chain``: ``PrefixKeys.prefix_chains`` (the tenant-keyed HMAC chain, 4 blocks of 16);
* ``policy``: ``PolicyEnforcementPoint.decide`` (a decision-cache hit).

Reported per stage and tree: µs of thread CPU per call (best of 7 loops in a process, median over
the rounds) and the Python calls of one call (``sys.setprofile``: ``call`` + ``c_call`` events; a
noise-free proxy). Warm loops: in a serving gateway the same code costs ~2-3x more (caches).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import click

from sim.click_options import ClickOptions

REPO = Path(__file__).resolve().parents[1]

_CHILD = r'''
import asyncio, json, sys, tempfile, time
from pathlib import Path
from sim.demo import DemoPaths, prepare_identity, gateway_config, bearer_headers
from gateway.config import load_config
from gateway.build import build
from gateway.replicas import Replica
from gateway.request import parse_inference_request
from starlette.requests import Request

N, ONLY = int(sys.argv[1]), sys.argv[2].split(",")
paths = DemoPaths.under(Path(tempfile.mkdtemp(prefix="gate-stages-")))
issuer = prepare_identity(paths)
cfg = gateway_config("cache_aware", [{"replica_id": "r0", "url": "http://127.0.0.1:9"}], ["tenant-a"], paths,
                     listen_port=1, admin_port=2)
gw = build(load_config(None, cfg))
tok = bearer_headers(issuer, ["tenant-a"])("tenant-a")["Authorization"].encode()
scope = {"type": "http", "method": "POST", "path": "/v1/completions", "query_string": b"",
         "headers": [(b"host", b"x"), (b"content-type", b"application/json"), (b"authorization", tok)],
         "client": ("127.0.0.1", 5555)}
bodies = [json.dumps({"model": "sim-model", "prompt": " ".join(f"w{n}x{j}" for j in range(64)),
                      "max_tokens": 1}).encode() for n in range(N)]
adm, lim, loop = gw.admission, gw.config.limits, asyncio.new_event_loop()
def run(co):
    try:
        co.send(None)
    except StopIteration as s:
        return s.value
    return loop.run_until_complete(co)
ident = run(gw.authn.authenticate(Request(scope), "127.0.0.1"))
tenant = adm.resolve_tenant(ident)
bounds = adm.request_bounds(tenant)
cands = [Replica("r0", "http://127.0.0.1:9", pool="default")]
def parse(i):
    return parse_inference_request(bodies[i], "completions", lim.max_json_depth, max_messages=bounds.max_messages,
                                   max_batch_prompts=bounds.max_batch_prompts, max_json_items=lim.max_json_items)
reqs = [parse(i) for i in range(N)]
toks = [adm.prompt_tokens(bounds, r, None) for r in reqs]
stages = {
    "auth": lambda i: run(gw.authn.authenticate(Request(scope), "127.0.0.1")),
    "parse": parse,
    "tokenize": lambda i: adm.prompt_tokens(bounds, reqs[i], None),
    "chain": lambda i: gw.keys.prefix_chains(tenant, toks[i][0]),
    "policy": lambda i: run(gw.pep.decide(ident, tenant, reqs[i], toks[i][1], cands, "/v1/completions", 0)),
}
out = {}
for name in ONLY:
    f = stages[name]
    for i in range(200):
        f(i)
    calls = [0]
    def prof(frame, event, arg):
        if event in ("call", "c_call"):
            calls[0] += 1
    sys.setprofile(prof); f(7); sys.setprofile(None)
    best = 1e9
    for _ in range(7):
        t = time.thread_time()
        for i in range(N):
            f(i)
        best = min(best, (time.thread_time() - t) / N * 1e6)
    out[name] = {"us": round(best, 3), "calls": calls[0] - 1}  # minus the setprofile(None) call
print(json.dumps(out))
'''

STAGES = ("auth", "parse", "tokenize", "chain", "policy")


def measure(tree: Path, stages: Sequence[str], n: int) -> dict[str, dict[str, float]]:
    """One child process on ``tree``: ``{stage: {"us", "calls"}}``. Raises ``RuntimeError`` when it fails."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(n), ",".join(stages)], env=env, cwd=tree,
                         capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: prints one Markdown table."""
    ap = ClickOptions("bench.gate_stages", __doc__ or "")
    ap.option("--baseline", type=click.Path(path_type=Path, exists=True), required=True)
    ap.option("--rounds", type=int, default=6)
    ap.option("--requests", type=int, default=2000)
    ap.option("--stage", "stages", multiple=True, type=click.Choice(STAGES), help="default: all")
    args = ap.parse(argv)
    stages = list(args.stages or STAGES)
    trees = {"this": REPO, "baseline": args.baseline.resolve()}
    got: dict[str, list[dict[str, dict[str, float]]]] = {k: [] for k in trees}
    for r in range(args.rounds):
        for name in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
            got[name].append(measure(trees[name], stages, args.requests))
    lines = [f"{args.rounds} rounds, {args.requests} requests; µs thread CPU per call (median of rounds), Python calls",
             "", "| stage | baseline µs | this µs | change | baseline calls | this calls |", "|---|---:|---:|---:|---:|---:|"]
    for s in stages:
        b = statistics.median(x[s]["us"] for x in got["baseline"])
        t = statistics.median(x[s]["us"] for x in got["this"])
        lines.append(f"| {s} | {b:.2f} | {t:.2f} | {100 * (t - b) / b:+.0f} % | {got['baseline'][0][s]['calls']:.0f} "
                     f"| {got['this'][0][s]['calls']:.0f} |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
