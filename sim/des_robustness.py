"""tests/routing/test_s2_routing_robustness.py's DES checks on several trace windows (session 12).

``python -m sim.des_robustness --params '{"queue_externality_weight": 1.0}' [--windows 6] [--rows 2000]``
(not part of the tests; about half a second of CPU per window and setting). For each replica
setting of the test (fifo ×0.25, fifo ×4, chunked ×0.5, chunked ×4) and each ``--rows``-row window
of the Mooncake trace (window 0 is the test's own rows; arrivals shifted to 0), ``cache_aware``
with ``--params`` runs on six replicas with a fresh calibration, and the test's checks are applied
to every replica: >= 250 first bytes (``S``), learnt rate within 20 % of the truth (``R``), queue
weight >= 0.8 on fifo / <= 0.4 on chunked (``W``). Prints one line per setting: ``okNNNpX.XX``
(passed; NNN the fewest requests on one replica, X.XX prefill busy max/mean) or the failed checks.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from routing.calibration import Calibration
from routing.policies import build_policy
from sim import des
from sim.click_options import ClickOptions

__all__ = ["SETTINGS", "check_window", "main"]

#: (replica model, prefill speed multiplier) of test_s2's parametrizations
SETTINGS = (("fifo", 0.25), ("fifo", 4.0), ("chunked", 0.5), ("chunked", 4.0))


def check_window(params: dict[str, object], reqs: Sequence[des.SimRequest], model: str, mult: float) -> str:
    """The test's checks on one run (module doc): ``okNNNpX.XX`` or the failed letters."""
    cfg = des.SimConfig(prefill_tokens_per_s=10000.0 * mult, replica_model=model)
    cal = Calibration(prior_rate=10000.0)
    res = des.simulate("cache_aware", build_policy("cache_aware", params), reqs, cfg, cal)
    true = cfg.prefill_tokens_per_s / cfg.token_scale
    ests = [cal.estimate(f"r{i}") for i in range(cfg.replicas)]
    if any(e is None or not e.calibrated for e in ests):
        return "uncalibrated"
    fewest = min(e.samples for e in ests)  # type: ignore[union-attr]
    out = f"S{fewest}" if fewest < 250 else ""
    if max(abs(e.prefill_tokens_per_s / true - 1.0) for e in ests) > 0.20:  # type: ignore[union-attr]
        out += "R"
    weights = [e.queue_weight for e in ests]  # type: ignore[union-attr]
    if (min(weights) < 0.8) if model == "fifo" else (max(weights) > 0.4):
        out += "W"
    return out or f"ok{fewest}p{res.prefill_imbalance:.2f}"


def main(argv: Sequence[str] | None = None) -> int:
    """Print the checks of every setting and window."""
    ap = ClickOptions(prog="python -m sim.des_robustness", description=__doc__.splitlines()[0])
    ap.option("--params", default="{}", help="JSON cache_aware parameters")
    ap.option("--windows", type=int, default=6)
    ap.option("--rows", type=int, default=2000)
    args = ap.parse(argv)
    params = json.loads(args.params)
    trace = des.load_trace(rows=args.windows * args.rows)
    for model, mult in SETTINGS:
        marks = []
        for w in range(args.windows):
            reqs = trace[w * args.rows:(w + 1) * args.rows]
            t0 = reqs[0].arrival
            marks.append(check_window(params, [dataclasses.replace(r, arrival=r.arrival - t0) for r in reqs],
                                      model, mult))
        print(f"{model} {mult:g}: {' '.join(marks)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
