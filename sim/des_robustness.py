"""tests/routing/test_s2_routing_robustness.py's DES checks on several trace windows (sessions 12, 13).

``python -m sim.des_robustness --params '{"queue_externality_weight": 1.0}' [--windows 6] [--rows 2000]
[--at decision|end]`` (not part of the tests; about half a second of CPU per window and setting). For
each replica setting of the test (fifo ×0.25, fifo ×4, chunked ×0.5, chunked ×4) and each
``--rows``-row window of the Mooncake trace (window 0 is the test's own rows; arrivals shifted to 0),
``cache_aware`` with ``--params`` runs on six replicas with a fresh calibration, and the test's checks
are applied to every replica: >= 250 first bytes (``S``), learnt rate within 20 % of the truth
(``R``), queue weight >= 0.8 on fifo / <= 0.4 on chunked (``W``). Prints one line per setting:
``okNNNpX.XX`` (passed; NNN the fewest requests on one replica, X.XX prefill busy max/mean) or the
failed checks, then the worst rate error and the extreme queue weight of every window.

Which estimates are judged (session 13, ``--at``): ``decision`` (the default, and what the test
judges since session 13) reads each replica's estimate as the router last read it, at the window's
last routing decision (:class:`ReadRecordingCalibration`); ``end`` reads it after the run, when
every request has had its first byte (sessions 2-12). The two differ by the drain: after the last
arrival each replica still delivers ~30-40 first bytes (about half the weight of a fit with
``forget`` 0.98) with no later arrival sharing the rate, so a shared (chunked) replica's learnt rate
jumps by up to +60 % there (the fit's missing term, future arrivals, is absent), an estimate no
routing decision ever reads.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Sequence

from routing.calibration import Calibration, ReplicaEstimate
from routing.policies import build_policy
from sim import des
from sim.click_options import ClickOptions

__all__ = ["SETTINGS", "ReadRecordingCalibration", "WindowCheck", "check_window", "main", "run_window", "test_verdict",
           "windows"]

#: (replica model, prefill speed multiplier) of test_s2's parametrizations
SETTINGS = (("fifo", 0.25), ("fifo", 4.0), ("chunked", 0.5), ("chunked", 4.0))


class ReadRecordingCalibration(Calibration):
    """A :class:`routing.calibration.Calibration` that keeps, per replica, the estimate it last returned
    from :meth:`estimate` (``last_read``: replica id -> estimate or ``None``). In the DES only the router
    reads estimates (one read per candidate and decision), so after a run ``last_read`` holds what the
    window's last routing decision saw; read it before calling :meth:`estimate` yourself."""

    def __init__(self, prior_rate: float = 10000.0, **estimator_kw: float) -> None:
        super().__init__(prior_rate, **estimator_kw)
        self.last_read: dict[str, ReplicaEstimate | None] = {}

    def estimate(self, replica_id: str) -> ReplicaEstimate | None:
        """:meth:`Calibration.estimate`, remembered in ``last_read``."""
        est = super().estimate(replica_id)
        self.last_read[replica_id] = est
        return est


@dataclasses.dataclass(frozen=True)
class WindowCheck:
    """The test's figures on one run: ``fewest`` first bytes on one replica (after the run), the worst
    ``rate_error`` (|learnt / true − 1|, over the replicas), the ``min_weight`` and ``max_weight`` of the
    queue weights, ``prefill_imbalance`` (prefill busy max/mean); ``calibrated``: every replica had a
    calibrated estimate when judged."""

    model: str
    fewest: int
    rate_error: float
    min_weight: float
    max_weight: float
    prefill_imbalance: float
    calibrated: bool

    def failed(self) -> str:
        """The failed checks' letters (module doc), ``""`` when all pass."""
        if not self.calibrated:
            return "uncalibrated"
        out = f"S{self.fewest}" if self.fewest < 250 else ""
        if self.rate_error > 0.20:
            out += "R"
        if (self.min_weight < 0.8) if self.model == "fifo" else (self.max_weight > 0.4):
            out += "W"
        return out


def run_window(params: dict[str, object], reqs: Sequence[des.SimRequest], model: str, mult: float,
               at: str = "decision") -> WindowCheck:
    """Run ``cache_aware`` with ``params`` on ``reqs`` (6 replicas of ``model`` at ``mult`` × 10k
    tokens/s, a fresh calibration with prior 10k) and judge the estimates ``at`` ``"decision"`` or
    ``"end"`` (module doc). Raises :class:`ValueError` for another ``at``."""
    if at not in ("decision", "end"):
        raise ValueError("at must be 'decision' or 'end'")
    cfg = des.SimConfig(prefill_tokens_per_s=10000.0 * mult, replica_model=model)
    cal = ReadRecordingCalibration(prior_rate=10000.0)
    res = des.simulate("cache_aware", build_policy("cache_aware", params), reqs, cfg, cal)
    read = dict(cal.last_read)
    true = cfg.prefill_tokens_per_s / cfg.token_scale
    ids = [f"r{i}" for i in range(cfg.replicas)]
    after = {r: cal.estimate(r) for r in ids}
    ests = [read.get(r) if at == "decision" else after[r] for r in ids]
    fewest = min((e.samples if e is not None else 0) for e in after.values())
    ok = [e for e in ests if e is not None and e.calibrated]
    if len(ok) < len(ests):
        return WindowCheck(model, fewest, float("inf"), 0.0, 1.0, res.prefill_imbalance, False)
    weights = [e.queue_weight for e in ok]
    return WindowCheck(model, fewest, max(abs(e.prefill_tokens_per_s / true - 1.0) for e in ok),
                       min(weights), max(weights), res.prefill_imbalance, True)


def test_verdict(checks: Sequence[WindowCheck]) -> str:
    """test_s2's verdict on one setting's windows (session 13): every window calibrated, rate error
    <= 0.20 and, on fifo, the smallest queue weight >= 0.8; over the windows, the mean of the fewest
    first bytes >= 250 and, on chunked, the mean of the largest queue weight <= 0.4. ``"pass"`` or
    ``"fail:"`` and the failed parts (``C`` calibrated, ``R`` rate, ``W`` weight, ``S`` mean count)."""
    out = ""
    if not all(c.calibrated for c in checks):
        out += "C"
    if any(c.rate_error > 0.20 for c in checks):
        out += "R"
    if any(c.model == "fifo" and c.min_weight < 0.8 for c in checks):
        out += "W"
    if statistics.mean(c.fewest for c in checks) < 250:
        out += "S"
    if checks and checks[0].model == "chunked" and statistics.mean(c.max_weight for c in checks) > 0.4:
        out += "W"
    return f"fail:{out}" if out else "pass"


def windows(count: int, rows: int) -> list[list[des.SimRequest]]:
    """``count`` consecutive ``rows``-row windows of the Mooncake trace, arrivals shifted to 0."""
    trace = des.load_trace(rows=count * rows)
    out = []
    for w in range(count):
        reqs = trace[w * rows:(w + 1) * rows]
        t0 = reqs[0].arrival
        out.append([dataclasses.replace(r, arrival=r.arrival - t0) for r in reqs])
    return out


def check_window(params: dict[str, object], reqs: Sequence[des.SimRequest], model: str, mult: float,
                 at: str = "decision") -> str:
    """The test's checks on one run (module doc): ``okNNNpX.XX`` or the failed letters."""
    c = run_window(params, reqs, model, mult, at)
    return c.failed() or f"ok{c.fewest}p{c.prefill_imbalance:.2f}"


def main(argv: Sequence[str] | None = None) -> int:
    """Print the checks of every setting and window."""
    ap = ClickOptions(prog="python -m sim.des_robustness", description=__doc__.splitlines()[0])
    ap.option("--params", default="{}", help="JSON cache_aware parameters")
    ap.option("--windows", type=int, default=6)
    ap.option("--rows", type=int, default=2000)
    ap.option("--at", default="decision", help="decision: estimates at the last routing decision; end: after the run")
    args = ap.parse(argv)
    params = json.loads(args.params)
    wins = windows(args.windows, args.rows)
    for model, mult in SETTINGS:
        checks = [run_window(params, reqs, model, mult, args.at) for reqs in wins]
        marks = [c.failed() or f"ok{c.fewest}p{c.prefill_imbalance:.2f}" for c in checks]
        wname = "min weight" if model == "fifo" else "max weight"
        wfig = [c.min_weight if model == "fifo" else c.max_weight for c in checks]
        print(f"{model} {mult:g}: {' '.join(marks)} | rate error {' '.join(f'{c.rate_error:.2f}' for c in checks)}"
              f" | {wname} {' '.join(f'{x:.2f}' for x in wfig)} (mean {statistics.mean(wfig):.2f})"
              f" | mean fewest {statistics.mean(c.fewest for c in checks):.0f} | test_s2 {test_verdict(checks)}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
