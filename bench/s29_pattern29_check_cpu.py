"""Session 29 (pattern29, S29-pattern29-1): the gateway's CPU for ``limits.json_schema.quote_reading_patterns``:
:func:`gateway.pattern_quote.pattern_reads_quote` per pattern, and
:func:`gateway.response_format.response_format_refusal` for one schema holding the 41 admitted ordinary patterns
(tests/support/ordinary_patterns.py) with the bound ``refuse`` and ``allow`` (its difference is the check's cost).
In-process thread CPU (``time.thread_time``), median of 7 runs; the load average printed beside.
Usage: ``python -m bench.s29_pattern29_check_cpu``.
"""

from __future__ import annotations


from bench.harness import median_thread_cpu_us as _us
from gateway.config_http import JsonSchemaLimits
from gateway.pattern_quote import pattern_reads_quote
from gateway.response_format import response_format_refusal
from tests.support.ordinary_patterns import ORDINARY


def main() -> None:
    with open("/proc/loadavg") as f:
        print(f"load average: {f.read().split()[:3]}")
    print("| input | characters | verdict | thread CPU µs per call |")
    print("|---|---|---|---|")
    cases = {f"ordinary {k}": v for k, v in ORDINARY.items() if k in (
        "date", "email bounded", "url bounded", "semver", "url escaped", "month name", "free text 1-200")}
    cases.update({"1,024 literal characters": "a" * 1024, "1,024 characters of classes": "[a-z0-9_]" * 113 + "a" * 7,
                  "1,024 characters of groups": "(?:ab|cd)" * 113 + "x" * 7,
                  "1,024 characters, quote at the end": "[a-z]" * 204 + "."})
    for name, p in cases.items():
        print(f"| {name} | {len(p):,} | {'reads' if pattern_reads_quote(p) else 'quote-free'} | "
              f"{_us(lambda: pattern_reads_quote(p), 2000):.1f} |")
    admitted = [v for v in ORDINARY.values() if not pattern_reads_quote(v)]
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string", "pattern": v}
                                               for i, v in enumerate(admitted)}}
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    # max_pattern_states (session 30) off, as in session 29: these 41 patterns together pass its default cap (the
    # assert below failed at 66abcdf4; seen by tidy31)
    wide = {"max_pattern_chars": 4096, "max_pattern_states": None}
    for mode in ("allow", "refuse", "allow", "refuse"):  # twice each: an A/A view of the noise
        limits = JsonSchemaLimits(quote_reading_patterns=mode)
        assert response_format_refusal(rf, limits, wide, 100) is None
        cpu = _us(lambda: response_format_refusal(rf, limits, wide, 100), 200)
        print(f"| response_format_refusal, {len(admitted)} ordinary patterns in one schema, {mode} | "
              f"{sum(map(len, admitted)):,} | admitted | {cpu:.1f} |")


if __name__ == "__main__":
    main()
