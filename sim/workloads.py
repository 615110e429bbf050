"""The public-trace workloads shared by the offline simulator and the live grid (session 20).

Moved here from :mod:`sim.des_traces` (session 12) so that :mod:`sim.grid` replays the same
rows at the same load as ``python -m sim.des_traces`` without importing the simulator:

* ``mooncake``: Mooncake's conversation trace (seed ``s`` = rows ``s*rows ..``, rebased to 0);
* ``azure-code`` / ``azure-conv``: the Azure 2023 traces (:mod:`sim.trace_azure`), no shared
  prefixes (seed ``s`` = rows ``s*rows ..``);
* ``azure-code+sys`` / ``azure-conv+sys``: the same rows with :data:`SYS_TENANTS` Zipf-weighted
  tenants, each with a :data:`SYS_BLOCKS`-block (2,048-token) system prompt
  (:func:`sim.trace_azure.with_system_prompts`, tenant draw seeded);
* ``servegen``: ServeGen m-large per-client sessions (:func:`sim.trace_servegen.synthesize`,
  16 busiest clients of window 0, seeded; tenant = client).

:func:`scale_to_load` sets a load level: timestamps scaled so that the uncached prefill work at
the default speed (0.005 s + real tokens / 10,000 per request) over the span is ``load`` times
the replicas' capacity (the trace's own burstiness is kept).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

from sim.trace import DEFAULT_TRACE_PATH, TraceRequest, load_mooncake, sim_prompt_tokens
from sim.trace_azure import AZURE_CODE, AZURE_CONV, load_azure, with_system_prompts
from sim.trace_servegen import load_lengths, load_rates, synthesize

__all__ = ["DEFAULT_RATE", "OWN_TENANTS", "REPLICAS", "SYS_BLOCKS", "SYS_TENANTS", "WORKLOADS", "scale_to_load"]

REPLICAS = 6
DEFAULT_RATE = 10000.0
SYS_TENANTS, SYS_BLOCKS = 8, 4


def _single(reqs: list[TraceRequest]) -> tuple[list[TraceRequest], list[str]]:
    return reqs, ["t0"] * len(reqs)


def _rebase(reqs: list[TraceRequest]) -> list[TraceRequest]:
    t0 = reqs[0].timestamp
    return [dataclasses.replace(r, timestamp=r.timestamp - t0) for r in reqs]


@lru_cache(maxsize=1)
def _rates() -> Any:
    return load_rates()


@lru_cache(maxsize=1)
def _lengths() -> Any:
    return load_lengths()


#: workload name -> (seed, rows) -> (requests in arrival order, tenant per request)
WORKLOADS: dict[str, Callable[[int, int], tuple[list[TraceRequest], list[str]]]] = {
    "mooncake": lambda seed, rows: _single(_rebase(load_mooncake(DEFAULT_TRACE_PATH, (seed + 1) * rows)[seed * rows:])),
    "azure-code": lambda seed, rows: _single(load_azure(AZURE_CODE, rows, skip=seed * rows)),
    "azure-code+sys": lambda seed, rows: with_system_prompts(load_azure(AZURE_CODE, rows, skip=seed * rows),
                                                             SYS_TENANTS, SYS_BLOCKS, seed),
    "azure-conv": lambda seed, rows: _single(load_azure(AZURE_CONV, rows, skip=seed * rows)),
    "azure-conv+sys": lambda seed, rows: with_system_prompts(load_azure(AZURE_CONV, rows, skip=seed * rows),
                                                             SYS_TENANTS, SYS_BLOCKS, seed),
    "servegen": lambda seed, rows: synthesize(_rates(), _lengths(), rows=rows, seed=seed),
}

#: workloads whose rows carry their own tenant (the others give the placeholder ``t0`` to every row)
OWN_TENANTS = frozenset({"azure-code+sys", "azure-conv+sys", "servegen"})


def scale_to_load(reqs: Sequence[TraceRequest], load: float, replicas: int = REPLICAS,
                  rate: float = DEFAULT_RATE, overhead_s: float = 0.005) -> list[TraceRequest]:
    """``reqs`` with timestamps multiplied so that their uncached prefill work (``overhead_s`` +
    real tokens of the simulated prompt / ``rate`` each) over the span is ``load`` x ``replicas``;
    raises :class:`ValueError` for ``load <= 0`` or fewer than 2 distinct timestamps."""
    if load <= 0:
        raise ValueError("load must be > 0")
    span = reqs[-1].timestamp - reqs[0].timestamp if reqs else 0.0
    if span <= 0:
        raise ValueError("need at least two distinct timestamps to scale a load")
    work = sum(overhead_s + sim_prompt_tokens(r) * 16 / rate for r in reqs)
    factor = work / (load * replicas * span)
    return [dataclasses.replace(r, timestamp=(r.timestamp - reqs[0].timestamp) * factor) for r in reqs]
