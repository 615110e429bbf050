"""Azure LLM inference trace 2023 (Splitwise) for the offline simulation (session 12).

Source: ``github.com/Azure/AzurePublicDataset`` (commit ``b469a113``), files
``data/AzureLLMInferenceTrace_code.csv`` and ``..._conv.csv``, described in
``AzureLLMInferenceDataset2023.md``; CC-BY 4.0, Patel et al., "Splitwise: Efficient
generative LLM inference using phase splitting", ISCA 2024. Copied unchanged to ``data/traces/azure-llm-2023/``
(``data/traces/SOURCES.md``; statistics in the project's shared trace notes, SOURCES.md section 2).

Format: CSV with the header ``TIMESTAMP,ContextTokens,GeneratedTokens``; TIMESTAMP is the
invocation wall-clock time (``2023-11-16 18:17:03.9799600``, up to 7 fractional digits),
ContextTokens the prompt length and GeneratedTokens the output length (tokens).
:func:`load_azure` turns each row into a :class:`sim.trace.TraceRequest` whose timestamp is
seconds since the first row read.

The trace has **no prefix information**, so the prefix is a model, stated here:

* ``none`` (:func:`load_azure`'s own ids): every 512-token block of every request gets a
  fresh id; no two requests share a block, so routing is pure load balancing and every
  hit rate (and the pooled bound) is 0;
* ``system`` (:func:`with_system_prompts`): each request belongs to one of ``tenants``
  tenants, drawn with Zipf(1) weights (tenant ``k`` has weight ``1/(k+1)``; the ServeGen
  characterisation in SOURCES.md section 3 has the top client at ~28 % of requests) from a
  generator seeded with ``seed``; each tenant has a system prompt of ``blocks`` 512-token
  blocks that leads every prompt of that tenant, but the last block of a prompt is always
  the user's own (fresh): a prompt of ``n`` blocks shares ``min(blocks, n - 1)`` of them, so
  one-block prompts share nothing.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from sim.trace import TRACE_BLOCK_TOKENS, TraceFormatError, TraceRequest

__all__ = ["AZURE_DIR", "AZURE_CODE", "AZURE_CONV", "HEADER", "load_azure", "parse_timestamp",
           "with_system_prompts", "zipf_tenants"]

AZURE_DIR = Path(__file__).resolve().parent.parent / "data" / "traces" / "azure-llm-2023"
AZURE_CODE = AZURE_DIR / "AzureLLMInferenceTrace_code.csv"
AZURE_CONV = AZURE_DIR / "AzureLLMInferenceTrace_conv.csv"
HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")

#: fresh block ids start here, above every system-prompt id
_FRESH_BASE = 1 << 32


def parse_timestamp(text: str) -> float:
    """Seconds since the epoch (naive, read as UTC) of ``YYYY-MM-DD HH:MM:SS[.f{1,7}]``;
    raises :class:`ValueError` on any other text (datetime keeps only 6 fractional digits,
    so the 7th is added separately)."""
    whole, _, frac = text.strip().partition(".")
    base = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")
    if frac and (not frac.isdigit() or len(frac) > 9):
        raise ValueError(f"bad fractional seconds {frac!r}")
    epoch = (base - datetime(1970, 1, 1)).total_seconds()
    return epoch + (int(frac) / 10 ** len(frac) if frac else 0.0)


def load_azure(path: str | Path, limit: int | None = None, skip: int = 0) -> list[TraceRequest]:
    """Rows ``skip .. skip+limit`` (all if ``limit`` is ``None``) of an Azure 2023 CSV as
    :class:`TraceRequest` rows with the ``none`` prefix model (module doc): timestamps in
    seconds since the first returned row, ``index`` the 0-based data row number.

    Raises :class:`TraceFormatError` naming the line (1-based, the header is line 1) for a
    wrong header, a wrong field count, an unparsable timestamp, ContextTokens < 1,
    GeneratedTokens < 0 or a timestamp earlier than the previous row's; :class:`OSError`
    if the file cannot be read.
    """
    out: list[TraceRequest] = []
    t0: float | None = None
    prev = -math.inf
    with open(path, encoding="utf-8", newline="") as fh:
        rows = csv.reader(fh)
        head = next(rows, None)
        if head is None or tuple(h.strip() for h in head) != HEADER:
            raise TraceFormatError(f"line 1: header must be {','.join(HEADER)}, got {head!r}")
        for n, row in enumerate(rows):
            lineno = n + 2
            if n < skip:
                continue
            if limit is not None and len(out) >= limit:
                break
            if len(row) != 3:
                raise TraceFormatError(f"line {lineno}: expected 3 fields, got {len(row)}")
            try:
                ts = parse_timestamp(row[0])
                inp, outp = int(row[1]), int(row[2])
            except ValueError as exc:
                raise TraceFormatError(f"line {lineno}: not an Azure trace row: {exc}") from exc
            if inp < 1 or outp < 0:
                raise TraceFormatError(f"line {lineno}: ContextTokens must be >= 1 and GeneratedTokens >= 0")
            if ts < prev:
                raise TraceFormatError(f"line {lineno}: timestamp goes backwards")
            prev = ts
            if t0 is None:
                t0 = ts
            nblocks = math.ceil(inp / TRACE_BLOCK_TOKENS)
            base = _FRESH_BASE + n * 1024
            out.append(TraceRequest(n, ts - t0, inp, outp, tuple(range(base, base + nblocks))))
    return out


def zipf_tenants(count: int, tenants: int, seed: int) -> list[int]:
    """``count`` tenant numbers in ``0..tenants-1`` drawn with weights ``1/(k+1)`` by
    ``random.Random(seed)``; raises :class:`ValueError` for ``tenants < 1``."""
    if tenants < 1:
        raise ValueError("tenants must be >= 1")
    rng = random.Random(f"zipf:{seed}")
    return rng.choices(range(tenants), weights=[1 / (k + 1) for k in range(tenants)], k=count)


def with_system_prompts(reqs: Sequence[TraceRequest], tenants: int, blocks: int,
                        seed: int) -> tuple[list[TraceRequest], list[str]]:
    """The ``system`` prefix model (module doc): ``reqs`` with their first ``min(blocks,
    len - 1)`` block ids replaced by their tenant's system-prompt ids, and the tenant names
    (``tenant-<k>``) parallel to them. Raises :class:`ValueError` for ``blocks < 0`` or
    ``tenants < 1``."""
    if blocks < 0:
        raise ValueError("blocks must be >= 0")
    who = zipf_tenants(len(reqs), tenants, seed)
    out = []
    for r, k in zip(reqs, who):
        shared = min(blocks, len(r.hash_ids) - 1)
        ids = tuple(k * 1024 + j for j in range(shared)) + r.hash_ids[shared:]
        out.append(TraceRequest(r.index, r.timestamp, r.input_length, r.output_length, ids))
    return out, [f"tenant-{k}" for k in who]
