"""Micro-benchmark: gateway CPU per worst-case request before it reaches a replica (issue 12).

``python -m bench.request_cost [--reps R] [--out FILE]``

Builds a real :class:`gateway.components.Components` (not started: no
replica is called) and runs, on each body, the request work of
:meth:`gateway.pipeline.InferencePipeline.handle` from the body bytes to the
routing step: :func:`gateway.request.parse_inference_request` with the
tenant's bounds, the batch charge, the byte bound and the early-stopping
tokenizer (``Components.prompt_tokens``), ``check_prompt`` and the prefix
chain. Process CPU time (``time.process_time``), milliseconds per request,
best of ``R`` repetitions. The bodies are the worst cases of issue 12
(1 MiB prompts, 30,000 messages, a 16-prompt batch, tools, floods of tiny
JSON values) for a tenant with
``max_prompt_tokens`` 100 and one with none (body cap 1 MiB, the default).

Results go to ``bench/results/request_cost.json`` and ``.md`` (or ``--out``).
A benchmark, not a test: the numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.auditing import AuditHub
from gateway.components import Components
from gateway.config import load_config
from gateway.errors import GatewayError
from gateway.request import parse_inference_request

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "results" / "request_cost.json"
MIB = 1 << 20


def _components(tmp: Path) -> Components:
    secret = tmp / "master.key"
    secret.write_text(secrets.token_hex(32))
    os.chmod(secret, 0o600)
    bundle = tmp / "bundle.json"
    bundle.write_text(json.dumps({"keys": []}))
    cfg = load_config(None, {
        "replicas": [{"id": "r0", "url": "http://127.0.0.1:9"}],
        "tenancy": {"master_secret_file": str(secret), "master_secret_env": None, "tenants": [
            {"id": "small", "spiffe_ids": ["spiffe://bench.test/small/"], "max_prompt_tokens": 100},
            {"id": "open", "spiffe_ids": ["spiffe://bench.test/open/"]},
        ]},
        "identity": {"trust_domains": {"bench.test": {"bundle_file": str(bundle)}}},
        "policy": {"mode": "embedded", "dir": str(ROOT / "rego")},
    })
    return Components(cfg, audit=AuditHub(None))


def _bodies() -> dict[str, tuple[str, bytes]]:
    words = "word " * (MIB // 5 - 20)
    run = "a" * (MIB - 100)
    msgs = [{"role": "user", "content": "hi"}] * 30_000
    near = " ".join(f"w{i}" for i in range(99))
    tools = [{"type": "function", "function": {"name": f"f{i}", "description": "x " * 40}} for i in range(2000)]

    def dump(doc: dict[str, Any]) -> bytes:
        return json.dumps({"model": "sim-model", "max_tokens": 16, **doc}).encode()

    return {
        "1 MiB of short words": ("completions", dump({"prompt": words})),
        "1 MiB word-character run": ("completions", dump({"prompt": run})),
        "30,000 chat messages": ("chat", dump({"messages": msgs})),
        "16-prompt batch, 99 tokens each": ("completions", dump({"prompt": [near] * 16})),
        "2,000 tools (~700 KB)": ("chat", dump({"messages": [{"role": "user", "content": near}], "tools": tools})),
        "1 MiB of empty tool objects": ("chat", dump({"messages": [{"role": "user", "content": "hi"}],
                                                     "tools": [{}] * (MIB // 4)})),
        "1 MiB of empty arrays in a tool": ("chat", dump({"messages": [{"role": "user", "content": "hi"}],
                                                          "tools": [{"a": [[]] * (MIB // 4)}]})),
        "32,000 empty tool objects (just under the JSON-value cap)": (
            "chat", dump({"messages": [{"role": "user", "content": "hi"}], "tools": [{}] * 32_000})),
        "2,000 messages (under the messages ceiling)": ("chat", dump({"messages": msgs[:2000]})),
        "one 99-token prompt (baseline)": ("completions", dump({"prompt": near})),
    }


def _one(c: Components, tenant: Any, endpoint: str, raw: bytes) -> str:
    """The pipeline's work on one body up to routing; returns the outcome code."""
    lease = c.limiter.admit(tenant)
    try:
        bounds = c.request_bounds(tenant)
        req = parse_inference_request(raw, endpoint, c.config.limits.max_json_depth,  # type: ignore[arg-type]
                                      max_messages=bounds.max_messages, max_batch_prompts=bounds.max_batch_prompts,
                                      max_json_items=c.config.limits.max_json_items)
        c.admit_sequences(tenant, lease, req.sequences)
        tokens, total = c.prompt_tokens(bounds, req)
        c.check_prompt(tenant, total, req.sequences)
        c.prefix_chains(tenant, tokens)
        return f"accepted ({total} tokens)"
    except GatewayError as err:
        return f"{err.status} {err.code}"
    finally:
        lease.release()


def _cpu_ms(fn: Callable[[], Any], reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return round(best * 1000.0, 3)


def run(reps: int) -> dict[str, Any]:
    """Measure every body for every tenant; returns the result document."""
    with tempfile.TemporaryDirectory() as d:
        c = _components(Path(d))
        rows = []
        for tid in ("small", "open"):
            tenant = c.registry.get(tid)
            for name, (endpoint, raw) in _bodies().items():
                outcome = _one(c, tenant, endpoint, raw)
                ms = _cpu_ms(lambda: _one(c, tenant, endpoint, raw), reps)
                rows.append({"tenant": tid, "max_prompt_tokens": tenant.max_prompt_tokens, "body": name,
                             "body_bytes": len(raw), "outcome": outcome, "cpu_ms": ms})
    return {"benchmark": "request_cost", "reps": reps, "python": platform.python_version(),
            "machine": platform.machine(), "rows": rows}


def to_markdown(doc: dict[str, Any]) -> str:
    """A table of the result document."""
    lines = ["| tenant (max_prompt_tokens) | body | bytes | outcome | gateway CPU ms |",
             "|---|---|---:|---|---:|"]
    for r in doc["rows"]:
        lines.append(f"| {r['tenant']} ({r['max_prompt_tokens']}) | {r['body']} | {r['body_bytes']} | "
                     f"{r['outcome']} | {r['cpu_ms']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    doc = run(args.reps)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(to_markdown(doc))
    print(to_markdown(doc), end="")


if __name__ == "__main__":
    main()
