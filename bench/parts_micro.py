"""Micro-benchmark: CPU of a chat body whose ``content`` is a list of text parts vs the same tokens as strings
(session 20, S20-R3).

``PYTHONPATH=<tree> python -m bench.parts_micro [--reps 40]`` (run it once per tree: the baseline and yours).

For each body, in process, min and median of ``--reps`` runs (``time.perf_counter``, milliseconds) of each stage
of the request work that depends on the body's shape: ``parse`` (:func:`gateway.request.parse_inference_request`
with ``max_messages`` 2,000: chat_units, the schema or the shortcut, the chat template render, sizes),
``tokens`` (the word tokenizer's ``encode`` of the rendered text and of ``extra_text``), ``forward``
(:func:`gateway.request.upstream_body` and its orjson encoding, as the proxy sends it), ``to route`` (the whole
pipeline work up to routing as ``bench.request_cost`` runs it: limiter, bounds, parse, admission, token count,
prefix chains; a built gateway, tenant ``open``, so ``max_messages`` is the gateway's). Bodies: one message of
1,600 one-word text parts; the same words as one string; 1,300 messages of one one-word part; 1,300 string
messages. Prints a Markdown table. A benchmark, not a test: the figures depend on the machine and its load.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import orjson

from bench.request_cost import _components, _one
from gateway.request import parse_inference_request, upstream_body
from sim.click_options import ClickOptions
from tenancy.tokenizer import WordTokenizer

_WORDS = [f"w{i % 97}" for i in range(1600)]
BODIES: dict[str, dict[str, Any]] = {
    "1 msg x 1,600 parts": {"model": "m", "max_tokens": 8, "messages": [
        {"role": "user", "content": [{"type": "text", "text": w} for w in _WORDS]}]},
    "1 msg, 1 string (same words)": {"model": "m", "max_tokens": 8, "messages": [
        {"role": "user", "content": " ".join(_WORDS)}]},
    "1,300 msgs x 1 part": {"model": "m", "max_tokens": 8, "messages": [
        {"role": "user", "content": [{"type": "text", "text": w}]} for w in _WORDS[:1300]]},
    "1,300 string msgs": {"model": "m", "max_tokens": 8, "messages": [
        {"role": "user", "content": w} for w in _WORDS[:1300]]},
}


def _time(fn: Callable[[], Any], reps: int) -> tuple[float, float]:
    """(min, median) milliseconds of ``reps`` calls of ``fn`` after one warm-up call."""
    fn()
    runs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - t0) * 1e3)
    return min(runs), statistics.median(runs)


def main() -> None:
    """Print one Markdown row per body: min/median ms of parse, tokens and forward."""
    ap = ClickOptions(description=__doc__.splitlines()[0])
    ap.option("--reps", type=int, default=40)
    args = ap.parse()
    tok = WordTokenizer()
    print("| body | parse ms min/med | tokens ms min/med | forward ms min/med | to route ms min/med | tokens | outcome |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        gw = _components(Path(d))
        _rows(gw, gw.registry.get("open"), tok, args.reps)


def _rows(gw: Any, tenant: Any, tok: WordTokenizer, reps: int) -> None:
    """Print the table's rows."""
    for name, doc in BODIES.items():
        raw = json.dumps(doc).encode()
        req = parse_inference_request(raw, "chat", max_messages=2000)
        n = len(tok.encode(req.text)) + (len(tok.encode(req.extra_text)) if req.extra_text else 0)
        parse = _time(lambda: parse_inference_request(raw, "chat", max_messages=2000), reps)
        tokens = _time(lambda: (tok.encode(req.text), req.extra_text and tok.encode(req.extra_text)), reps)
        fwd = _time(lambda: orjson.dumps(upstream_body(req, 8, None)), reps)
        outcome = _one(gw, tenant, "chat", raw)
        route = _time(lambda: _one(gw, tenant, "chat", raw), reps)
        print(f"| {name} | {parse[0]:.3f}/{parse[1]:.3f} | {tokens[0]:.3f}/{tokens[1]:.3f} | "
              f"{fwd[0]:.3f}/{fwd[1]:.3f} | {route[0]:.3f}/{route[1]:.3f} | {n} | {outcome} |")


if __name__ == "__main__":
    main()
