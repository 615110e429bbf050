"""ServeGen (Alibaba Bailian) workloads for the offline simulation (session 12).

Source: ``github.com/alibaba/ServeGen`` (snapshot ``f891d118``, Apache-2.0; Xiang et al.,
"ServeGen: Workload Characterization of Large Language Model Serving in Production",
arXiv:2505.09999). Copies in ``data/traces/servegen/``; derivation in ``data/traces/SOURCES.md``.

Files read here:

* ``*_client_rates_day1.csv``: ``client_id,window_start_s,rate_rps,iat_cv,iat_dist,dist_arg1,
  dist_arg2`` per client and 600 s window (day 1 of ``data/<category>/<model>/chunk-<client>-trace.csv``):
  the fitted inter-arrival distribution, ``Gamma`` (arg1 shape, arg2 scale: ``iat_cv`` equals
  ``1/sqrt(arg1)``) or ``Weibull`` (arg1 shape, arg2 scale); rate 0 = idle;
* ``*_client_lengths_day1.csv``: ``client_id,window_start_s,field,mean,p50,p99,max`` per client,
  6-hour window and ``field`` (``input_tokens`` / ``output_tokens``), from the dataset PMFs;
* ``offline_trace_a_head93.jsonl``: 93 rows of ``data/offline/trace_a.jsonl`` (a batch job, no
  timestamps): ``request_id, type, input_length, hash_ids`` (16-token blocks), ``img_ids``.

The rate and length files carry **no prefix information**; :func:`synthesize` draws per-client
sessions from them with a seed (the prefix model, stated here):

* clients: the ``clients`` busiest clients of the window ``window_s`` that have length rows,
  each a tenant ``client-<id>``, keeping their published relative rates (tenant skew);
* arrivals: per client, inter-arrival gaps from its fitted family and shape (arg1) with the
  mean rescaled to ``1/rate_rps`` (the fitted scale rarely gives that mean exactly), merged;
* lengths: log-normal with median ``p50`` and mean ``mean`` (sigma = sqrt(2 ln(mean/p50)), 0.1
  if ``mean <= p50``), clipped to ``[1, max]``, for the new part of a prompt and the output;
* prefix: every client has a system prompt of ``system_blocks`` 512-token blocks leading each
  of its prompts (a new session of ``n`` blocks shares ``min(system_blocks, n - 1)``: the last
  block is the user's own); with probability ``follow`` a request is the next turn of one of the
  client's 4 most recent sessions (chosen uniformly) with fewer than ``max_turns`` turns:
  its prompt is that session's last prompt plus its output plus the new part, so it shares the
  previous prompt's full 512-token blocks (capped at 32,768 tokens, else a new session).

The offline trace's 16-token ids are regrouped into 512-token ids (:func:`load_servegen_offline`):
its shared 160-token instruction is under one 512-token block, so at the simulator's block size
the offline rows share nothing (SOURCES.md: all of its 46.4 % reuse is that prefix).
"""

from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sim.trace import TRACE_BLOCK_TOKENS, TraceFormatError, TraceRequest

__all__ = ["SERVEGEN_DIR", "MLARGE_RATES", "MLARGE_LENGTHS", "OFFLINE_A", "ClientWindow", "LengthStats",
           "load_rates", "load_lengths", "load_servegen_offline", "synthesize"]

SERVEGEN_DIR = Path(__file__).resolve().parent.parent / "data" / "traces" / "servegen"
MLARGE_RATES = SERVEGEN_DIR / "language_m-large_client_rates_day1.csv"
MLARGE_LENGTHS = SERVEGEN_DIR / "language_m-large_client_lengths_day1.csv"
OFFLINE_A = SERVEGEN_DIR / "offline_trace_a_head93.jsonl"
RATE_HEADER = ("client_id", "window_start_s", "rate_rps", "iat_cv", "iat_dist", "dist_arg1", "dist_arg2")
LENGTH_HEADER = ("client_id", "window_start_s", "field", "mean", "p50", "p99", "max")
MAX_PROMPT = 32768


@dataclass(frozen=True)
class ClientWindow:
    """One client in one 600 s window: ``rate`` req/s, ``dist`` ``Gamma``/``Weibull``/``""`` (idle), ``shape``."""

    client: int
    window_s: int
    rate: float
    dist: str
    shape: float


@dataclass(frozen=True)
class LengthStats:
    """Token-length summary of one client, 6-hour window and field (tokens)."""

    mean: float
    p50: float
    p99: float
    max: float


def _rows(path: str | Path, header: tuple[str, ...]) -> list[tuple[int, list[str]]]:
    with open(path, encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh))
    if not rows or tuple(h.strip() for h in rows[0]) != header:
        raise TraceFormatError(f"line 1: header must be {','.join(header)}")
    out = []
    for n, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise TraceFormatError(f"line {n}: expected {len(header)} fields, got {len(row)}")
        out.append((n, row))
    return out


def load_rates(path: str | Path = MLARGE_RATES) -> list[ClientWindow]:
    """Parse a client-rates CSV; :class:`TraceFormatError` names the line of a bad row (wrong
    header or field count, non-numbers, negative rate, unknown family, shape <= 0 when active)."""
    out = []
    for n, row in _rows(path, RATE_HEADER):
        try:
            cw = ClientWindow(int(row[0]), int(row[1]), float(row[2]), row[4].strip(), float(row[5]))
        except ValueError as exc:
            raise TraceFormatError(f"line {n}: not a client-rate row: {exc}") from exc
        if cw.rate < 0 or not math.isfinite(cw.rate):
            raise TraceFormatError(f"line {n}: rate_rps must be a finite number >= 0")
        if cw.rate > 0 and (cw.dist not in ("Gamma", "Weibull") or not cw.shape > 0):
            raise TraceFormatError(f"line {n}: an active window needs iat_dist Gamma or Weibull and dist_arg1 > 0")
        out.append(cw)
    return out


def load_lengths(path: str | Path = MLARGE_LENGTHS) -> dict[tuple[int, int, str], LengthStats]:
    """Parse a client-lengths CSV into ``{(client, window_start_s, field): LengthStats}``;
    :class:`TraceFormatError` names the line of a bad row (unknown field, non-numbers, p50 < 1,
    or not ``p50 <= max``)."""
    out = {}
    for n, row in _rows(path, LENGTH_HEADER):
        if row[2] not in ("input_tokens", "output_tokens"):
            raise TraceFormatError(f"line {n}: field must be input_tokens or output_tokens")
        try:
            key = (int(row[0]), int(row[1]), row[2])
            st = LengthStats(*(float(v) for v in row[3:]))
        except ValueError as exc:
            raise TraceFormatError(f"line {n}: not a client-length row: {exc}") from exc
        if not (1 <= st.p50 <= st.max and st.mean > 0):
            raise TraceFormatError(f"line {n}: need 1 <= p50 <= max and mean > 0")
        out[key] = st
    return out


def _length_sampler(st: LengthStats, rng: random.Random):  # type: ignore[no-untyped-def]
    sigma = math.sqrt(2 * math.log(st.mean / st.p50)) if st.mean > st.p50 else 0.1
    mu = math.log(st.p50)
    return lambda: int(min(st.max, max(1.0, round(rng.lognormvariate(mu, sigma)))))


def _gap_sampler(cw: ClientWindow, rng: random.Random):  # type: ignore[no-untyped-def]
    mean = 1.0 / cw.rate
    if cw.dist == "Gamma":
        return lambda: rng.gammavariate(cw.shape, mean / cw.shape)
    scale = mean / math.gamma(1 + 1 / cw.shape)
    return lambda: rng.weibullvariate(scale, cw.shape)


def _lengths_for(lengths: dict[tuple[int, int, str], LengthStats], client: int, window_s: int,
                 field: str) -> LengthStats | None:
    starts = [w for (c, w, f) in lengths if c == client and f == field and w <= window_s]
    return lengths[(client, max(starts), field)] if starts else None


def synthesize(rates: Sequence[ClientWindow], lengths: dict[tuple[int, int, str], LengthStats], *,
               rows: int, seed: int, window_s: int = 0, clients: int = 16, system_blocks: int = 2,
               follow: float = 0.5, max_turns: int = 8) -> tuple[list[TraceRequest], list[str]]:
    """``rows`` requests (timestamps in s from 0, in arrival order) and their tenants, drawn
    per client with ``random.Random(seed)`` as the module doc states. Raises :class:`ValueError`
    if no client of ``window_s`` is active with length rows, or for ``rows < 1``."""
    if rows < 1:
        raise ValueError("rows must be >= 1")
    active = [cw for cw in rates if cw.window_s == window_s and cw.rate > 0
              and _lengths_for(lengths, cw.client, window_s, "input_tokens")
              and _lengths_for(lengths, cw.client, window_s, "output_tokens")]
    active = sorted(active, key=lambda cw: (-cw.rate, cw.client))[:clients]
    if not active:
        raise ValueError(f"no active client with lengths in window {window_s}")
    rng = random.Random(f"servegen:{seed}")
    total = sum(cw.rate for cw in active)
    arrivals: list[tuple[float, int]] = []
    for cw in active:
        gap, t = _gap_sampler(cw, rng), 0.0
        want = max(1, round(1.5 * rows * cw.rate / total))
        for _ in range(want):
            t += gap()
            arrivals.append((t, cw.client))
    arrivals.sort()
    arrivals = arrivals[:rows]
    by_client = {cw.client: cw for cw in active}
    new_in = {c: _length_sampler(_lengths_for(lengths, c, window_s, "input_tokens"), rng) for c in by_client}  # type: ignore[arg-type]
    new_out = {c: _length_sampler(_lengths_for(lengths, c, window_s, "output_tokens"), rng) for c in by_client}  # type: ignore[arg-type]
    sessions: dict[int, list[list]] = {c: [] for c in by_client}  # [turns, input_length, output_length, ids]
    fresh = 1 << 40
    reqs: list[TraceRequest] = []
    t0 = arrivals[0][0]
    for i, (t, c) in enumerate(arrivals):
        add, outp = new_in[c](), new_out[c]()
        open_ = [s for s in sessions[c][-4:] if s[0] < max_turns]
        s = rng.choice(open_) if open_ and rng.random() < follow else None
        if s is not None and s[1] + s[2] + add <= MAX_PROMPT:
            inp = s[1] + s[2] + add
            keep = list(s[3][: s[1] // TRACE_BLOCK_TOKENS])
        else:
            s, inp = None, add
            keep = [(c + 1) * (1 << 20) + j for j in range(min(system_blocks, math.ceil(inp / TRACE_BLOCK_TOKENS) - 1))]
        n = math.ceil(inp / TRACE_BLOCK_TOKENS)
        ids = keep + list(range(fresh, fresh + n - len(keep)))
        fresh += n
        if s is None:
            sessions[c].append([1, inp, outp, ids])
        else:
            s[:] = [s[0] + 1, inp, outp, ids]
        reqs.append(TraceRequest(i, t - t0, inp, outp, tuple(ids)))
    return reqs, [f"client-{c}" for _, c in arrivals]


def load_servegen_offline(path: str | Path = OFFLINE_A, output_length: int = 128) -> list[TraceRequest]:
    """The offline batch rows as :class:`TraceRequest` rows (timestamp 0, ``output_length`` as
    given: the file has none), 16-token ids regrouped into 512-token ids (the id of a group is
    a dense number of the 16-token ids up to its end, so equal ids mean equal prefixes).
    Raises :class:`TraceFormatError` naming the line for bad JSON, missing fields,
    ``input_length < 1`` or ``len(hash_ids) != ceil(input_length/16)``."""
    dense: dict[tuple[int, ...], int] = {}
    out = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                inp, ids = rec["input_length"], rec["hash_ids"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise TraceFormatError(f"line {n}: not a ServeGen offline record: {exc}") from exc
            if not isinstance(inp, int) or inp < 1 or not isinstance(ids, list) \
                    or not all(isinstance(h, int) for h in ids) or len(ids) != math.ceil(inp / 16):
                raise TraceFormatError(f"line {n}: need input_length >= 1 and ceil(input_length/16) int hash_ids")
            per = TRACE_BLOCK_TOKENS // 16
            big = [dense.setdefault(tuple(ids[: min(len(ids), (g + 1) * per)]), len(dense))
                   for g in range(math.ceil(inp / TRACE_BLOCK_TOKENS))]
            out.append(TraceRequest(len(out), 0.0, inp, output_length, tuple(big)))
    return out
