"""Session 31 (pattern31, S31-pattern31-1; the open row: S30-pattern30-4): which default of
``limits.json_schema.max_pattern_states`` bounds the worst admitted pattern's outlines-core ``Index`` cost with a
large vocabulary while admitting the ordinary patterns.

For each candidate cap (``--caps``, default 2048 3072 4096 8192 16384) the largest member of each permissive family the
gateway admits at that cap (:func:`gateway.response_format.response_format_refusal` with
``JsonSchemaLimits(max_pattern_states=cap)``; one required property, and the same budget split over 2 properties),
built by outlines-core 0.2.14 over the 26,792-token vocabulary of bench/s30_pattern30_states.py (``--big``: every
printable ASCII character, every 2 of them, every 3 of ``[a-z]``) in a child bounded to 3 GiB of address space and
``--cpu`` s of CPU (:func:`bench.s30_pattern30_states._index`): the ``Index`` CPU (the child's process CPU) and the
child's ``VmHWM`` growth. Then each of the 41 quote-free ordinary patterns (tests/support/ordinary_patterns.py): its
count, the caps that admit it and its ``Index`` with the same vocabulary; and the 13 ordinary schemas
(tests/support/ordinary_schemas.py, as ``response_format`` and all together as ``tools``) at each cap.

outlines-core is not a project dependency: ``OUTLINES_PYTHON`` names an interpreter that has it. Usage:
``OUTLINES_PYTHON=/tmp/oc-venv/bin/python python -m bench.s31_pattern31_default [worst|ordinary|schemas] [--caps N ...] [--cpu S]``.
Markdown on stdout, the load average before every table.
"""

from __future__ import annotations

import os
from typing import Any

import click

from bench.s30_pattern30_states import _index
from gateway.config_http import JsonSchemaLimits
from gateway.pattern_quote import pattern_reads_quote
from gateway.pattern_states import pattern_states
from gateway.response_format import response_format_refusal, tools_refusal
from tests.support.ordinary_patterns import ORDINARY
from tests.support.ordinary_schemas import ORDINARY as ORDINARY_SCHEMAS

#: permissive quote-free families: name -> (pattern of a size k, the smallest k, the largest k tried)
FAMILIES: dict[str, tuple[Any, int, int]] = {
    "[a-z0-9]{1,k}": (lambda k: f"^[a-z0-9]{{1,{k}}}$", 1, 20000),
    "[ !#-~]{1,k} (printable ASCII but the quote)": (lambda k: f"^[ !#-~]{{1,{k}}}$", 1, 20000),
    "[a-z]*x[a-z]{k}": (lambda k: f"[a-z]*x[a-z]{{{k}}}", 1, 20),
}


def _loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def _props(*patterns: str) -> dict[str, Any]:
    props = {f"p{i}": {"type": "string", "pattern": p} for i, p in enumerate(patterns)}
    return {"type": "object", "properties": props, "required": list(props)}


def _admitted(schema: dict[str, Any], cap: int) -> bool:
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    return response_format_refusal(rf, JsonSchemaLimits(max_pattern_states=cap), {}, 0, "bench") is None


def _largest(family: Any, lo: int, hi: int, cap: int, parts: int) -> int | None:
    """The largest k in [lo, hi] whose schema of ``parts`` copies of ``family(k)`` is admitted at ``cap`` (counts
    grow with k), else None."""
    if not _admitted(_props(*[family(lo)] * parts), cap):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if _admitted(_props(*[family(mid)] * parts), cap) else (lo, mid - 1)
    return lo


def _cost(out: dict[str, Any] | str) -> str:
    return out if isinstance(out, str) else f"{out['index_s']} s, {out['index_mb']} MB"


def worst(caps: list[int], python: str, cpu_s: int) -> None:
    print(f"load average: {_loadavg()}\n")
    print("| cap | family | largest admitted | states counted | Index CPU, growth (26,792 tokens) |")
    print("|---|---|---|---|---|")
    for cap in caps:
        for name, (family, lo, hi) in FAMILIES.items():
            assert not pattern_reads_quote(family(lo)), name
            for parts in (1, 2):
                k = _largest(family, lo, hi, cap, parts)
                if k is None:
                    print(f"| {cap:,} | {name} x {parts} | none | | |", flush=True)
                    continue
                counted = parts * pattern_states(family(k), 1 << 20)
                got = _index(_props(*[family(k)] * parts), python, cpu_s, "big")
                print(f"| {cap:,} | {name} x {parts} | k = {k:,} | {counted:,} | {_cost(got)} |", flush=True)


def ordinary(caps: list[int], python: str, cpu_s: int) -> None:
    print(f"load average: {_loadavg()}\n")
    print("| ordinary pattern | states counted | admitted at | Index CPU, growth (26,792 tokens) |")
    print("|---|---|---|---|")
    for name, p in ORDINARY.items():
        if pattern_reads_quote(p):
            continue
        at = ", ".join(f"{c:,}" for c in caps if _admitted(_props(p), c)) or "none"
        print(f"| {name} | {pattern_states(p, 1 << 20):,} | {at} | {_cost(_index(_props(p), python, cpu_s, 'big'))} |",
              flush=True)
        if pattern_states(p, 1 << 20) > 1024:  # written twice: an array's items (no maxItems), as a named tool
            array = {"type": "object", "required": ["a"], "properties": {"a": {"type": "array", "items": {
                "type": "string", "pattern": p}}}}
            at = ", ".join(f"{c:,}" for c in caps if _admitted(array, c)) or "none"
            print(f"| {name}, an array of it (2 copies) | {2 * pattern_states(p, 1 << 20):,} | {at} | "
                  f"{_cost(_index(array, python, cpu_s, 'big'))} |", flush=True)
    print(f"\nload average: {_loadavg()}")


def _verdict(err: Any) -> str:
    return "admitted" if err is None else f"400 {err.record['reason'].rpartition('.')[2]}"


def schemas(caps: list[int]) -> None:
    """Each ordinary schema as ``response_format``, then all as tools, at each cap, with ``quote_reading_patterns``
    at its default (``refuse``) and ``allow`` (so that only the other bounds answer)."""
    for quote in ("refuse", "allow"):
        print(f"\nquote_reading_patterns: {quote}\n")
        print("| ordinary schema | " + " | ".join(f"cap {c:,}" for c in caps) + " |")
        print("|---|" + "---|" * len(caps))
        over = {"quote_reading_patterns": quote}
        for name, schema in ORDINARY_SCHEMAS.items():
            rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
            print(f"| {name} | " + " | ".join(_verdict(response_format_refusal(
                rf, JsonSchemaLimits(max_pattern_states=c), over, 0, "bench")) for c in caps) + " |")
        tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": s}}
                 for i, s in enumerate(ORDINARY_SCHEMAS.values())]
        for choice in ("auto", "required"):
            got = [tools_refusal(tools, JsonSchemaLimits(max_pattern_states=c), over, 0, choice, "bench") for c in caps]
            print(f"| all {len(tools)} as tools, tool_choice {choice} | " + " | ".join(map(_verdict, got)) + " |")


@click.command(help=(__doc__ or "").split("\n\n")[0])
@click.argument("what", type=click.Choice(["worst", "ordinary", "schemas"]))
@click.option("--caps", type=int, multiple=True, help="a candidate cap (repeat; default 2048 3072 4096 8192 16384)")
@click.option("--cpu", type=int, default=20, show_default=True, help="CPU seconds per outlines-core child (3 GiB each)")
def main(what: str, caps: tuple[int, ...], cpu: int) -> None:
    """Run one of the three tables (see the module docstring)."""
    chosen = list(caps) or [2048, 3072, 4096, 8192, 16384]
    python = os.environ.get("OUTLINES_PYTHON", "python3")
    if what == "worst":
        worst(chosen, python, cpu)
    elif what == "ordinary":
        ordinary(chosen, python, cpu)
    else:
        schemas(chosen)


if __name__ == "__main__":
    main()
