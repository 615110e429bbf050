"""Offline discrete-event simulation of N replicas behind PrefixGate's router.

No HTTP: the same timing model as the HTTP replica simulator (``sim/replica.py``),
driven by the Mooncake conversation trace at its own timestamps, routed by the
gateway's real :class:`routing.router.Router`, policies, prefix index
and load tracker (the tracker is driven by simulated first-byte and finish
events). Used to tune ``cache_aware``; results go to
``bench/results/des_tuning.md``.

Model (per replica):

* ``replica_model="fifo"`` (default): one FIFO prefill queue, one prefill at
  a time; the cache lookup happens when a request reaches the head of the
  queue and its blocks are inserted then; prefill time = 0.005 s + uncached
  simulator tokens × 16 / 10000 real tokens/s;
* ``replica_model="chunked"``: no prefill queue; every request starts its
  prefill on arrival (cache lookup then, blocks inserted when its prefill
  ends) and the prefills in progress share the replica's rate equally
  (processor sharing: with n in progress each advances at 1/n of the rate),
  the way chunked prefill batches the chunks of several requests in one
  step (vLLM and SGLang by default); the work of one prefill is the same
  0.005 s + uncached tokens / rate as above;
* decode runs concurrently and never blocks prefill: 0.02 s per output token
  (the trace's ``output_length``, real tokens);
* block-level LRU prefix cache of 4000 blocks of 16 simulator tokens (touched
  deepest-first, as vLLM frees blocks);
* each 512-token trace block = 32 simulator tokens (one simulator token stands
  for 16 real tokens), a partial last block ceil(rest/512·32) tokens, min 1.

TTFT = prefill end − arrival. Hit rate is token-weighted: cached simulator
tokens / prompt simulator tokens.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from routing.calibration import CalibratingLoadTracker, Calibration
from routing.index import InProcessPrefixIndex
from routing.load import InProcessLoadTracker, LoadTicket
from routing.plugins import RoutingPolicy, make_choice, require_candidates
from routing.policies import build_policy
from routing.router import Router
from routing.types import Candidate, RouteChoice, RouteRequest

__all__ = [
    "SimConfig",
    "SimRequest",
    "BlockLRU",
    "PolicyResult",
    "SGLangLikePolicy",
    "load_trace",
    "simulate",
    "pooled_bound",
    "infinite_bound",
    "main",
    "write_setting_table",
]

REPLICA_MODELS = ("fifo", "chunked")
TRACE_BLOCK_TOKENS = 512
SIM_TOKENS_PER_TRACE_BLOCK = 32
DEFAULT_TRACE = Path(__file__).resolve().parent.parent / "data" / "traces" / "conversation_trace.jsonl"


@dataclass(frozen=True)
class SimConfig:
    """Timing and cache model. Times in seconds, rates in real tokens/s,
    ``block_size`` and capacity in simulator tokens / blocks;
    ``replica_model`` ``fifo`` or ``chunked`` (module doc; raises
    :class:`ValueError` otherwise). ``hold_prefilling`` (session 9, late
    binding; ``None``: off): requests wait in one arrival-order queue in front
    of the router and are routed, head first, only among the replicas with
    fewer than this many requests dispatched and not yet at their first byte
    (a gateway-side queue, as flow control's room check would hold them)."""

    replicas: int = 6
    block_size: int = 16
    capacity_blocks: int = 4000
    token_scale: float = 16.0
    prefill_tokens_per_s: float = 10000.0
    prefill_overhead_s: float = 0.005
    decode_s_per_token: float = 0.02
    replica_model: str = "fifo"
    hold_prefilling: int | None = None

    def __post_init__(self) -> None:
        if self.replica_model not in REPLICA_MODELS:
            raise ValueError(f"replica_model must be one of {', '.join(REPLICA_MODELS)}")
        if self.hold_prefilling is not None and self.hold_prefilling < 1:
            raise ValueError("hold_prefilling must be >= 1 or None")


@dataclass(frozen=True)
class SimRequest:
    """One trace request in simulator units: ``arrival`` (s), ``prompt_tokens``
    (simulator tokens), ``output_tokens`` (real tokens, decode steps),
    ``keys`` (block-hash chain over full simulator blocks), ``tenant`` (the router's
    tenant id: its calibration fits per tenant, session 11)."""

    arrival: float
    prompt_tokens: int
    output_tokens: int
    keys: tuple[bytes, ...]
    tenant: str = "t0"


def _trace_block_tokens(input_length: int, i: int, n: int) -> int:
    if i < n - 1:
        return SIM_TOKENS_PER_TRACE_BLOCK
    rest = input_length - (n - 1) * TRACE_BLOCK_TOKENS
    return max(1, math.ceil(rest * SIM_TOKENS_PER_TRACE_BLOCK / TRACE_BLOCK_TOKENS))


def to_sim_request(row: Mapping[str, Any], block_size: int = 16) -> SimRequest:
    """Convert one Mooncake row (``timestamp`` ms, ``input_length``,
    ``output_length``, ``hash_ids``) to a :class:`SimRequest`. Simulator block
    keys are a BLAKE2b chain over (trace hash id, sub-block index)."""
    ids = list(row["hash_ids"])
    n = len(ids)
    keys: list[bytes] = []
    prev = b"des"
    tokens = 0
    for i, hid in enumerate(ids):
        t = _trace_block_tokens(int(row["input_length"]), i, n)
        tokens += t
        for j in range(t // block_size):
            prev = hashlib.blake2b(prev + hid.to_bytes(8, "big") + j.to_bytes(2, "big"), digest_size=16).digest()
            keys.append(prev)
        if t % block_size:
            break  # a partial block ends the chain of full blocks
    return SimRequest(row["timestamp"] / 1000.0, tokens, int(row["output_length"]), tuple(keys))


def load_trace(path: Path = DEFAULT_TRACE, rows: int = 2000, block_size: int = 16) -> list[SimRequest]:
    """First ``rows`` requests of a Mooncake JSONL trace as :class:`SimRequest`s."""
    out: list[SimRequest] = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if len(out) >= rows:
                break
            if line.strip():
                out.append(to_sim_request(json.loads(line), block_size))
    return out


class BlockLRU:
    """Replica-side LRU prefix cache (same eviction order as the index): ``match(keys)``
    gives the number of leading keys held, ``insert(keys)`` touches them (capacity in blocks)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.lru: OrderedDict[bytes, None] = OrderedDict()

    def match(self, keys: Sequence[bytes]) -> int:
        n = 0
        for k in keys:
            if k not in self.lru:
                break
            n += 1
        return n

    def insert(self, keys: Sequence[bytes]) -> None:
        lru = self.lru
        for k in reversed(keys[: self.capacity]):
            if k in lru:
                lru.move_to_end(k)
            else:
                lru[k] = None
        while len(lru) > self.capacity:
            lru.popitem(last=False)


class SGLangLikePolicy:
    """Imitation of SGLang router's ``cache_aware`` rule (sgl-router
    ``policies/cache_aware.rs``): load = running requests per worker; if
    ``max - min > balance_abs_threshold`` and ``max > min ·
    balance_rel_threshold`` route to the least loaded worker; otherwise, if the
    best prefix match ratio (matched / prompt tokens; SGLang counts characters)
    exceeds ``cache_threshold``, route to the best-matching worker, else to the
    least loaded one. The per-worker approximate tree is the gateway's prefix
    index here (same LRU eviction)."""

    name = "sglang_like"

    def __init__(
        self, balance_abs_threshold: int = 32, balance_rel_threshold: float = 1.0001, cache_threshold: float = 0.5
    ) -> None:
        self.abs_t = balance_abs_threshold
        self.rel_t = balance_rel_threshold
        self.cache_t = cache_threshold

    def choose(self, req: RouteRequest, candidates: Sequence[Candidate]) -> RouteChoice:
        """See :class:`routing.policies.RoutingPolicy`."""
        require_candidates(candidates)
        loads = {c.replica_id: float(c.load.running_requests) for c in candidates}
        mx, mn = max(loads.values()), min(loads.values())
        least = min(candidates, key=lambda c: (c.load.running_requests, c.replica_id))
        if mx - mn > self.abs_t and mx > mn * self.rel_t:
            return make_choice(self.name, req, candidates, least, "imbalanced", loads)
        best = max(candidates, key=lambda c: (c.matched_blocks, -c.load.running_requests, c.replica_id))
        ratio = min(best.matched_blocks * req.block_size, req.prompt_tokens) / max(1, req.prompt_tokens)
        if ratio > self.cache_t:
            return make_choice(self.name, req, candidates, best, "cache_match", loads)
        return make_choice(self.name, req, candidates, least, "min_load", loads)


@dataclass
class PolicyResult:
    """Per-policy outcome: TTFT percentiles (s), token-weighted hit rate,
    request count max/mean over replicas, prefill busy time max/mean."""

    name: str
    ttft_p50: float
    ttft_p90: float
    ttft_p99: float
    hit_rate: float
    req_imbalance: float
    prefill_imbalance: float
    predicted_rate: float
    extra: dict[str, float] = field(default_factory=dict)


def _pct(sorted_vals: Sequence[float], p: float) -> float:
    if not sorted_vals:
        return math.nan
    k = (len(sorted_vals) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (k - lo)


def simulate(name: str, policy: RoutingPolicy, reqs: Sequence[SimRequest], cfg: SimConfig = SimConfig(),
             calibration: Calibration | None = None, ttft_out: list[float] | None = None,
             detail_out: list[dict[str, Any]] | None = None) -> PolicyResult:
    """Replay ``reqs`` through a fresh :class:`Router` with ``policy`` on
    ``cfg.replicas`` simulated replicas; returns a :class:`PolicyResult`.

    With ``calibration`` (made here, as the gateway does, when the policy's
    config has ``calibrate`` on), the router's load tracker is a
    :class:`routing.calibration.CalibratingLoadTracker` on the simulated
    clock (first-byte times feed it) and the candidates carry its estimates;
    without, the router uses the configured constants. ``ttft_out`` (optional,
    session 9) is filled with each request's TTFT (s), in the order of ``reqs``. ``detail_out`` (optional,
    session 16) is filled with one dict per request, in the order of ``reqs``: ``replica``, ``reason`` (the
    policy's), ``predicted`` / ``available`` prefix tokens (simulator tokens), ``cached`` (delivered),
    ``prompt``, ``ahead`` (requests before it on its replica at dispatch: queued + in progress), ``prefill``
    (its own prefill work, s) and ``ttft`` (s)."""
    ids = [f"r{i}" for i in range(cfg.replicas)]
    if calibration is None and getattr(getattr(policy, "config", None), "calibrate", False):
        calibration = Calibration(prior_rate=policy.config.prefill_tokens_per_s)  # type: ignore[attr-defined]
    clock = [0.0]
    loads: Any = InProcessLoadTracker()
    if calibration is not None:
        loads = CalibratingLoadTracker(loads, calibration, lambda: clock[0])
    router = Router(policy, InProcessPrefixIndex(cfg.capacity_blocks), loads, cfg.block_size, calibration)
    caches = {r: BlockLRU(cfg.capacity_blocks) for r in ids}
    queues: dict[str, list[int]] = {r: [] for r in ids}
    qhead = {r: 0 for r in ids}
    busy = {r: False for r in ids}
    served = {r: 0 for r in ids}
    prefill_busy = {r: 0.0 for r in ids}
    tickets: list[LoadTicket | None] = [None] * len(reqs)
    choices: list[RouteChoice | None] = [None] * len(reqs)
    ttft: list[float] = []
    cached_total = 0
    prompt_total = 0
    events: list[tuple[float, int, int, int, str]] = []  # time, kind order, seq, req idx, replica
    seq = 0
    ARRIVE, PREFILL_DONE, FINISH = 2, 0, 1
    chunked = cfg.replica_model == "chunked"
    # chunked: per replica, remaining work (s at the full rate) of each prefill in progress,
    # the time the shares were last advanced, and a version that invalidates stale completions
    active: dict[str, dict[int, float]] = {r: {} for r in ids}
    t_last = {r: 0.0 for r in ids}
    version = {r: 0 for r in ids}

    if ttft_out is not None:
        ttft_out[:] = [math.nan] * len(reqs)
    if detail_out is not None:
        detail_out[:] = [{} for _ in reqs]
    for i, r in enumerate(reqs):
        events.append((r.arrival, ARRIVE, i, i, ""))
    heapq.heapify(events)
    seq = len(reqs)

    def lookup(rid: str, i: int, insert: bool) -> float:
        nonlocal cached_total, prompt_total
        r = reqs[i]
        cache = caches[rid]
        matched = cache.match(r.keys)
        if insert:
            cache.insert(r.keys)
        cached = min(matched * cfg.block_size, r.prompt_tokens)
        cached_total += cached
        prompt_total += r.prompt_tokens
        router.observe_delivered(choices[i], cached)  # type: ignore[arg-type]
        dur = cfg.prefill_overhead_s + (r.prompt_tokens - cached) * cfg.token_scale / cfg.prefill_tokens_per_s
        prefill_busy[rid] += dur
        if detail_out is not None:
            detail_out[i].update(cached=cached, prefill=dur)
        return dur

    def start_next(rid: str, now: float) -> None:
        nonlocal seq
        q = queues[rid]
        if busy[rid] or qhead[rid] >= len(q):
            return
        i = q[qhead[rid]]
        qhead[rid] += 1
        dur = lookup(rid, i, insert=True)
        busy[rid] = True
        seq += 1
        heapq.heappush(events, (now + dur, PREFILL_DONE, seq, i, rid))

    def advance(rid: str, now: float) -> None:
        act = active[rid]
        if act:
            share = (now - t_last[rid]) / len(act)
            for k in act:
                act[k] -= share
        t_last[rid] = now

    def schedule(rid: str, now: float) -> None:
        nonlocal seq
        version[rid] += 1
        act = active[rid]
        if act:
            k = min(act, key=lambda j: (act[j], j))
            seq += 1
            # the replica field carries the version: "rid#version"
            heapq.heappush(events, (now + max(0.0, act[k]) * len(act), PREFILL_DONE, seq, k,
                                    f"{rid}#{version[rid]}"))

    def first_byte(i: int, rid: str, now: float) -> None:
        nonlocal seq
        ttft.append(now - reqs[i].arrival)
        if ttft_out is not None:
            ttft_out[i] = now - reqs[i].arrival
        if detail_out is not None:
            detail_out[i]["ttft"] = now - reqs[i].arrival
        tickets[i].first_byte()  # type: ignore[union-attr]
        seq += 1
        heapq.heappush(events, (now + reqs[i].output_tokens * cfg.decode_s_per_token, FINISH, seq, i, rid))

    held: deque[int] = deque()
    hold = cfg.hold_prefilling

    def dispatch(i: int, cand: Sequence[str], now: float) -> None:
        r = reqs[i]
        rq = RouteRequest(r.tenant, r.keys, r.prompt_tokens, r.output_tokens, cfg.block_size)
        choice, ticket = router.route(rq, cand)
        choices[i], tickets[i] = choice, ticket
        rid = choice.replica_id
        served[rid] += 1
        if detail_out is not None:
            ahead = len(active[rid]) if chunked else len(queues[rid]) - qhead[rid] + busy[rid]
            detail_out[i].update(replica=rid, reason=choice.reason, predicted=choice.predicted_prefix_tokens,
                                 available=choice.available_prefix_tokens, prompt=r.prompt_tokens, ahead=ahead)
        if chunked:
            advance(rid, now)
            active[rid][i] = lookup(rid, i, insert=False)
            schedule(rid, now)
        else:
            queues[rid].append(i)
            start_next(rid, now)

    def dispatch_held(now: float) -> None:
        while held:
            room = ids if hold is None else [r for r in ids if loads.snapshot(r).prefilling_requests < hold]
            if not room:
                return
            dispatch(held.popleft(), room, now)

    while events:
        now, kind, _, i, rid = heapq.heappop(events)
        clock[0] = now
        if kind == ARRIVE:
            held.append(i)
            dispatch_held(now)
        elif kind == PREFILL_DONE:
            if chunked:
                rid, _, ver = rid.partition("#")
                if int(ver) != version[rid]:
                    continue
                advance(rid, now)
                del active[rid][i]
                caches[rid].insert(reqs[i].keys)
                first_byte(i, rid, now)
                schedule(rid, now)
            else:
                busy[rid] = False
                first_byte(i, rid, now)
                start_next(rid, now)
            if held:
                dispatch_held(now)
        else:
            tickets[i].finish()  # type: ignore[union-attr]

    ttft.sort()
    c = router.counters()
    mean_req = sum(served.values()) / len(ids)
    mean_pf = sum(prefill_busy.values()) / len(ids)
    return PolicyResult(
        name=name,
        ttft_p50=_pct(ttft, 50),
        ttft_p90=_pct(ttft, 90),
        ttft_p99=_pct(ttft, 99),
        hit_rate=cached_total / max(1, prompt_total),
        req_imbalance=max(served.values()) / mean_req if mean_req else math.nan,
        prefill_imbalance=max(prefill_busy.values()) / mean_pf if mean_pf else math.nan,
        predicted_rate=c.predicted_prefix_tokens / max(1, c.prompt_tokens),
        extra={"available_rate": c.available_prefix_tokens / max(1, c.prompt_tokens)},
    )


def pooled_bound(reqs: Sequence[SimRequest], capacity_blocks: int, block_size: int = 16) -> float:
    """Token-weighted hit rate of ONE LRU holding ``capacity_blocks`` (all
    replicas' capacity pooled), replayed in arrival order."""
    cache = BlockLRU(capacity_blocks)
    hit = tot = 0
    for r in reqs:
        hit += min(cache.match(r.keys) * block_size, r.prompt_tokens)
        tot += r.prompt_tokens
        cache.insert(r.keys)
    return hit / max(1, tot)


def infinite_bound(reqs: Sequence[SimRequest], block_size: int = 16) -> float:
    """Token-weighted hit rate of an infinite cache (oracle upper bound)."""
    seen: set[bytes] = set()
    hit = tot = 0
    for r in reqs:
        m = 0
        for k in r.keys:
            if k not in seen:
                break
            m += 1
        hit += min(m * block_size, r.prompt_tokens)
        tot += r.prompt_tokens
        seen.update(r.keys)
    return hit / max(1, tot)


PolicyFactory = Callable[[], RoutingPolicy]


def default_policies() -> dict[str, PolicyFactory]:
    """The compared policies: the gateway's four (tuned defaults) and the SGLang imitation."""
    return {
        "round_robin": lambda: build_policy("round_robin", {}),
        "least_load": lambda: build_policy("least_load", {}),
        "consistent_hash": lambda: build_policy("consistent_hash", {"skip_blocks": 2}),
        "sglang_like": lambda: SGLangLikePolicy(),
        "cache_aware": lambda: build_policy("cache_aware", {}),
    }


def format_table(results: Sequence[PolicyResult]) -> str:
    """Markdown table of ``results``."""
    lines = [
        "| policy | TTFT p50 s | TTFT p90 s | TTFT p99 s | hit rate | predicted | req max/mean | prefill max/mean |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.name} | {r.ttft_p50:.3f} | {r.ttft_p90:.3f} | {r.ttft_p99:.3f} | {r.hit_rate:.3f} | "
            f"{r.predicted_rate:.3f} | {r.req_imbalance:.2f} | {r.prefill_imbalance:.2f} |"
        )
    return "\n".join(lines)


def write_setting_table(head: Sequence[str], run_setting: Callable[[Any], list[str]], jobs: Iterable[Any],
                        out: Path, processes: int = 2) -> str:
    """Markdown table of a settings sweep (``sim.des_sweep``, ``sim.des_windows``), written to ``out``.

    ``run_setting(job)`` (a picklable module-level function) gives the rows of one
    job; the jobs run in ``processes`` worker processes, their rows kept in job
    order under ``head`` (title, blank line, column line, separator). Creates
    ``out``'s folder; returns the text written (lines joined by newlines, one at the end)."""
    with ProcessPoolExecutor(processes) as ex:
        rows = [line for block in ex.map(run_setting, jobs) for line in block]
    text = "\n".join([*head, *rows]) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return text


TUNING_GRID: dict[str, tuple[float, ...]] = {
    "prefix_weight": (0.0, 4.0, 16.0, 32.0),
    "slack_requests": (0.0, 2.0, 4.0),
    "max_request_factor": (1.25, 2.0, 3.0),
}


def tune(reqs: Sequence[SimRequest], cfg: SimConfig, grid: Mapping[str, Sequence[float]] = TUNING_GRID) -> list[PolicyResult]:
    """Run ``cache_aware`` over the cartesian product of ``grid`` (other
    parameters at their defaults); results sorted by hit rate, best first."""
    import itertools

    keys = list(grid)
    out: list[PolicyResult] = []
    for values in itertools.product(*(grid[k] for k in keys)):
        params = dict(zip(keys, values))
        label = "cache_aware " + " ".join(f"{k}={v:g}" for k, v in params.items())
        out.append(simulate(label, build_policy("cache_aware", params), reqs, cfg))
    out.sort(key=lambda r: (-round(r.hit_rate, 3), r.ttft_p99))
    return out


@click.command()
@click.option("--rows", default=2000, show_default=True, help="trace rows to replay")
@click.option("--replicas", default=6, show_default=True)
@click.option("--trace", "trace_path", type=click.Path(exists=True, path_type=Path), default=DEFAULT_TRACE)
@click.option("--capacity-blocks", default=4000, show_default=True)
@click.option("--policy", "policies", multiple=True, help="restrict to these policies (repeatable)")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="write the markdown table here")
@click.option("--tune", "do_tune", is_flag=True, help="also run the cache_aware parameter grid")
@click.option("--replica-model", type=click.Choice(REPLICA_MODELS), default="fifo", show_default=True,
              help="fifo: one prefill at a time; chunked: concurrent prefills share the rate")
@click.option("--prefill-tokens-per-s", type=float, default=10000.0, show_default=True)
@click.option("--uncalibrated", is_flag=True,
              help="add cache_aware_uncalibrated (calibrate: false, the constants; the default calibrates)")
def main(
    rows: int,
    replicas: int,
    trace_path: Path,
    capacity_blocks: int,
    policies: tuple[str, ...],
    out: Path | None,
    do_tune: bool,
    replica_model: str,
    prefill_tokens_per_s: float,
    uncalibrated: bool,
) -> None:
    """Print a per-policy table (TTFT, hit rate, balance) for the trace."""
    cfg = SimConfig(replicas=replicas, capacity_blocks=capacity_blocks, replica_model=replica_model,
                    prefill_tokens_per_s=prefill_tokens_per_s)
    reqs = load_trace(trace_path, rows, cfg.block_size)
    pooled = pooled_bound(reqs, capacity_blocks * replicas, cfg.block_size)
    inf = infinite_bound(reqs, cfg.block_size)
    facs = default_policies()
    names = list(policies) or list(facs)
    results = [simulate(n, facs[n](), reqs, cfg) for n in names]
    if uncalibrated:
        results.append(simulate("cache_aware_uncalibrated", build_policy("cache_aware", {"calibrate": False}), reqs,
                                cfg))
    table = format_table(results)
    head = (
        f"rows={rows} replicas={replicas} capacity={capacity_blocks} blocks/replica; model={replica_model}; "
        f"pooled-cache bound={pooled:.3f} infinite-cache oracle={inf:.3f}"
    )
    click.echo(head)
    click.echo(table)
    text = f"{head}\n\n{table}\n"
    if do_tune:
        grid = format_table(tune(reqs, cfg))
        click.echo(grid)
        text += f"\n### cache_aware parameter grid (best hit rate first)\n\n{grid}\n"
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
