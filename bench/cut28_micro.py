"""In-process CPU of the session-28 ``cut28`` cuts, this tree vs others (not a test).

``python -m bench.cut28_micro --baseline DIR [--aa DIR] [--rounds 6] [--n 20000] [--name cut28_micro]``

Issue 14, session 28 (helper ``cut28``). Figures, each the best of 9 passes of ``--n`` calls in thread CPU µs
per call (``time.thread_time_ns``), each tree in its own process (``PYTHONPATH`` = the tree), the trees
interleaved (this, baseline, A/A copy of this) for ``--rounds`` rounds:

* ``plain_spaced``: a ``drop`` tenant's plain answer as the simulated replica writes it (aiohttp
  ``json_response``: ``", "`` and ``": "``), what the answer path runs on it (the details check, then
  ``plain_without_cached``);
* ``plain_compact``: the same answer compact (vLLM's shape; must not get slower);
* ``usage_event``: a stream's usage event (compact, as the simulator and vLLM write it) for a ``drop`` tenant
  (``event_for_drop``; once per stream that keeps its usage chunk);
* ``choose_one``: ``cache_aware``'s ``choose`` of one candidate (the gateway's setup: calibration, in-process
  index and loads; one replica), the choice's scores not read;
* ``choose_read``: the same, the choice's scores read once (``dict(choice.scores)``: what a debugging reader pays).
Medians and per-round differences: ``bench/results/<name>.{json,md}``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from bench._tree_rounds import code_child, interleaved, this_minus, this_minus_rows
from sim.click_options import ClickOptions

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"

_CHILD = r'''
import json, sys, time
sys.path.insert(0, TREE)
import orjson
from gateway import usage_privacy as up
from routing.calibration import Calibration, CalibratingLoadTracker
from routing.load import InProcessLoadTracker
from routing.index import InProcessPrefixIndex
from routing.config import policy_from_config
from routing.policies.cache_aware import CacheAwareConfig
from routing.router import Router
from routing.types import RouteRequest
assert up.__file__.startswith(TREE), up.__file__
OBJ = {"id": "cmpl-5f1e2d3c4b5a69788796a5b4", "object": "text_completion", "created": 1764670000,
       "model": "sim-model", "choices": [{"index": 0, "text": "lorem", "logprobs": None, "finish_reason": "length"}],
       "usage": {"prompt_tokens": 64, "completion_tokens": 1, "total_tokens": 65,
                 "prompt_tokens_details": {"cached_tokens": 48}}}
SPACED = json.dumps(OBJ).encode()
COMPACT = orjson.dumps(OBJ)

def plain(data):
    obj = orjson.loads(data)
    usage = obj.get("usage")
    def one():
        if ("prompt_tokens_details" in usage) or up.may_name_cached(data):
            return up.plain_without_cached(data, obj, usage)
        return data
    out = one()
    assert b"cached_tokens" not in out and orjson.loads(out) == up.without_counter(obj), out
    return one

def best(fn, n):
    b = 1e9
    for _ in range(9):
        t0 = time.thread_time_ns()
        for _ in range(n):
            fn()
        b = min(b, (time.thread_time_ns() - t0) / n / 1000)
    return b

res = {"plain_spaced": best(plain(SPACED), N), "plain_compact": best(plain(COMPACT), N)}
EV = {"id": "cmpl-0123456789abcdef01234567", "object": "text_completion", "created": 1764763200, "model": "sim-model",
      "choices": [], "usage": {"prompt_tokens": 85, "completion_tokens": 32, "total_tokens": 117,
                               "prompt_tokens_details": {"cached_tokens": 64}}}
PAYLOAD = orjson.dumps(EV)
out = up.event_for_drop(PAYLOAD, EV)
assert b"cached_tokens" not in out and orjson.loads(out[6:-2]) == up.without_counter(EV), out
res["usage_event"] = best(lambda: up.event_for_drop(PAYLOAD, EV), N)

cal = Calibration(prior_rate=10000.0)
cal.defer_observations(True)
loads = CalibratingLoadTracker(InProcessLoadTracker(), cal, time.monotonic)
router = Router(policy_from_config(CacheAwareConfig()), InProcessPrefixIndex(4000), loads, 16, cal)
req = RouteRequest(tenant_id="acme", block_keys=[b"k1", b"u1", b"v1", b"w1", b"x1"], prompt_tokens=85, max_tokens=1,
                   block_size=16)
cands = router.candidates(req, ["r0"])
pol = router.policy
res["choose_one"] = best(lambda: pol.choose(req, cands), N)
res["choose_read"] = best(lambda: dict(pol.choose(req, cands).scores), N)
print(json.dumps(res))
'''

FIGURES = ("plain_spaced", "plain_compact", "usage_event", "choose_one", "choose_read")


def one(tree: Path, n: int) -> dict[str, float]:
    """The figures (µs per call) on the code of ``tree``."""
    return code_child(_CHILD, tree, {"TREE": str(tree), "N": n},  # type: ignore[no-any-return]
                      env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"})


def run(trees: dict[str, Path], rounds: int, n: int) -> dict[str, Any]:
    """Interleaved rounds over ``trees`` (label -> source tree); returns the result document."""
    rows, _ = interleaved(trees, rounds, lambda tree: one(Path(tree), n), order="alternate",
                          describe=lambda got: " ".join(f"{f} {got[f]:.2f}" for f in FIGURES))
    runs = {k: {f: [r[f] for r in got] for f in FIGURES} for k, got in rows.items()}
    med, diffs = this_minus(runs, FIGURES)
    return {"trees": {k: str(v) for k, v in trees.items()}, "rounds": rounds, "n": n, "runs": runs,
            "median_us": med, "this_minus_median_us": diffs}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: writes ``<out>/<name>.{json,md}`` and prints the table."""
    ap = ClickOptions(prog="python -m bench.cut28_micro", description=__doc__.splitlines()[0])
    ap.option("--baseline", type=click.Path(path_type=Path), required=True)
    ap.option("--aa", type=click.Path(path_type=Path), default=None, help="a copy of this tree (A/A noise)")
    ap.option("--this", "this", type=click.Path(path_type=Path), default=REPO, help="default: this tree")
    ap.option("--rounds", type=int, default=6)
    ap.option("--n", type=int, default=20000)
    ap.option("--out", type=click.Path(path_type=Path), default=RESULTS)
    ap.option("--name", default="cut28_micro")
    args = ap.parse(argv)
    trees = {"this": Path(args.this).resolve(), "baseline": args.baseline.resolve(),
             **({"aa": args.aa.resolve()} if args.aa else {})}
    doc = run(trees, args.rounds, args.n)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"# Session-28 cut28 cuts, CPU per call in process (`python -m bench.cut28_micro`), {args.name}", "",
             f"{doc['rounds']} interleaved rounds, best of 9 x {doc['n']} calls each; thread CPU µs/call.", "",
             *this_minus_rows(doc["median_us"], doc["this_minus_median_us"], FIGURES)]
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
