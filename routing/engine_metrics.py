"""Engine metrics as vLLM and SGLang expose them (Prometheus text of ``GET /metrics``).

Pure (no I/O): :func:`parse_engine_metrics` turns the text the gateway
scraped (``gateway/engine_metrics.py``) into an :class:`EngineSample`, which
:class:`routing.calibration.Calibration` keeps per replica.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["EngineSample", "parse_engine_metrics", "read_lines"]


@dataclass(frozen=True)
class EngineSample:
    """One scrape of a replica's engine metrics; ``None`` where not exposed.

    ``running`` / ``waiting``: requests; ``kv_usage``: 0..1;
    ``prefix_hit_rate``: cumulative hit tokens / queried tokens (0..1);
    ``engine``: ``"vllm"`` or ``"sglang"`` (or ``""`` when nothing known was found).
    """

    engine: str = ""
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    prefix_hit_rate: float | None = None


_VLLM = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting",
         "vllm:kv_cache_usage_perc": "kv_usage", "vllm:gpu_cache_usage_perc": "kv_usage"}
_SGLANG = {"sglang:num_running_reqs": "running", "sglang:num_queue_reqs": "waiting",
           "sglang:token_usage": "kv_usage", "sglang:cache_hit_rate": "prefix_hit_rate"}


#: every name :func:`parse_engine_metrics` reads (a line is kept when its metric name starts with one)
_READ_NAMES = tuple(sorted({*_VLLM, *_SGLANG, "vllm:prefix_cache_hits", "vllm:prefix_cache_queries"}))


def read_lines(text: str) -> str:
    """The lines of Prometheus ``text`` whose metric name starts with a name :func:`parse_engine_metrics`
    reads: sample lines and their ``# HELP`` / ``# TYPE`` lines, in order, newline-terminated."""
    keep: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and parts[2].startswith(_READ_NAMES):
                keep.append(line)
        elif line.lstrip().startswith(_READ_NAMES):
            keep.append(line)
    return "\n".join(keep) + "\n" if keep else ""


def parse_engine_metrics(text: str) -> EngineSample:
    """Parse Prometheus text exposition of a vLLM or SGLang server.

    Values of one name are summed over label sets (one model per replica;
    several ``engine`` labels of a data-parallel server add up). Counters
    ``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries`` (with or
    without ``_total``) give ``prefix_hit_rate``. Unknown names are ignored:
    only the lines of the names read here (samples, ``# HELP`` / ``# TYPE``)
    reach the Prometheus parser (:func:`read_lines`; an engine's histograms are
    most of its text and the scrape runs on the gateway's event loop); a
    malformed line of those names raises :class:`ValueError`.
    """
    from prometheus_client.parser import text_string_to_metric_families

    vals: dict[str, float] = {}
    engine = ""
    hits = queries = None
    for fam in text_string_to_metric_families(read_lines(text)):
        for s in fam.samples:
            name = s.name
            if name.endswith("_total"):
                base = name[: -len("_total")]
            else:
                base = name
            v = float(s.value)
            if not math.isfinite(v):
                continue
            if base in _VLLM or base in _SGLANG:
                field = _VLLM.get(base) or _SGLANG[base]
                engine = engine or ("vllm" if base in _VLLM else "sglang")
                key = f"{base}|{field}"
                vals[key] = vals.get(key, 0.0) + v
            elif base == "vllm:prefix_cache_hits":
                hits = (hits or 0.0) + v
                engine = engine or "vllm"
            elif base == "vllm:prefix_cache_queries":
                queries = (queries or 0.0) + v
    out: dict[str, float] = {}
    for key, v in vals.items():
        base, field = key.split("|")
        if field in out and base == "vllm:gpu_cache_usage_perc":
            continue  # prefer kv_cache_usage_perc (the newer name)
        out[field] = v
    if "prefix_hit_rate" not in out and hits is not None and queries:
        out["prefix_hit_rate"] = hits / queries
    return EngineSample(engine=engine, running=out.get("running"), waiting=out.get("waiting"),
                        kv_usage=out.get("kv_usage"), prefix_hit_rate=out.get("prefix_hit_rate"))
