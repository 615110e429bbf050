"""Run Rego unit tests (``test_*`` rules) through the embedded OPA engine.

The bindings have no ``opa test``; this runner follows its rules: every
rule named ``test_*`` in a ``*_test.rego`` module is a test; it passes when
it evaluates to a value other than ``false`` and fails when it is ``false``
or undefined; an evaluation error is an ERROR (counted as failed). Rules are
discovered with OPA's own parser (the ``rego.parse_module`` builtin), not by
scanning text.

Usage: ``python -m policy.rego_test_runner rego/`` — prints one
``data.<pkg>.<rule>: PASS|FAIL|ERROR (t ms)`` line per test, then
``N passed, M failed``; exit status 1 when any test failed, 2 when the
policy set does not load or compile.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opa_bindings import OpaEngine, OpaError, OpaUndefinedError

from policy.decision import PolicyCompileError
from policy.loader import PolicySet, build_engine, compile_errors, load_policy_dir


@dataclass(frozen=True)
class TestResult:
    """One Rego test: ``name`` is ``data.<package>.<rule>``; ``outcome``
    is ``PASS``, ``FAIL`` or ``ERROR``; ``duration_ms`` in milliseconds."""

    name: str
    outcome: str
    duration_ms: float
    detail: str = ""


@dataclass(frozen=True)
class TestReport:
    """All results of one run; ``errors`` holds compile errors (OPA shape)
    when the set did not compile, in which case no test ran."""

    results: list[TestResult] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)

    @property
    def passed(self) -> int:
        """Number of passing tests."""
        return sum(r.outcome == "PASS" for r in self.results)

    @property
    def failed(self) -> int:
        """Number of failing or erroring tests."""
        return sum(r.outcome != "PASS" for r in self.results)

    @property
    def ok(self) -> bool:
        """True when the set compiled and no test failed."""
        return not self.errors and self.failed == 0

    def render(self) -> str:
        """Text report in the style of ``opa test -v``."""
        lines = [f"{e.get('code')}: {e.get('message')}" for e in self.errors]
        for r in self.results:
            extra = f": {r.detail}" if r.detail else ""
            lines.append(f"{r.name}: {r.outcome} ({r.duration_ms:.3f}ms){extra}")
        lines.append("-" * 80)
        if self.errors:
            lines.append("policy set does not compile; no test ran")
        else:
            lines.append(f"{self.passed} passed, {self.failed} failed")
        return "\n".join(lines)


def discover_tests(engine: OpaEngine, modules: Mapping[str, str]) -> list[str]:
    """Names (``pkg.path.test_x``, without ``data.``) of all test rules.

    Raises:
        PolicyCompileError: a module does not parse.
    """
    names: list[str] = []
    for module_id, source in sorted(modules.items()):
        try:
            rows = engine.eval_query(
                "m := rego.parse_module(input.id, input.src)", {"id": module_id, "src": source}
            )
        except OpaError as exc:
            raise PolicyCompileError(exc.message) from None
        ast = rows[0]["m"]
        pkg = ".".join(str(t["value"]) for t in ast["package"]["path"][1:])
        for rule in ast.get("rules", []):
            rule_name = rule.get("head", {}).get("name", "")
            if rule_name.startswith("test_") and not rule.get("head", {}).get("args"):
                full = f"{pkg}.{rule_name}"
                if full not in names:
                    names.append(full)
    return names


def run_tests(policy_set: PolicySet, allowed_builtins: Iterable[str] | None = None) -> TestReport:
    """Compile all modules (tests included) with the data, run every test.

    Test modules are checked against the built-in allow-list like the
    others (``allowed_builtins``; None: the default list) before any runs.
    Never raises for policy problems: compile errors (and refused
    built-ins, code ``rego_builtin_not_allowed``) land in ``errors``.
    """
    try:
        data = policy_set.data_tree()
        engine = build_engine(policy_set.modules, data, allowed_builtins=allowed_builtins)
    except PolicyCompileError as exc:
        return TestReport(errors=getattr(exc, "errors", compile_errors(str(exc))))
    try:
        names = discover_tests(engine, policy_set.tests())
        results: list[TestResult] = []
        for name in names:
            start = time.perf_counter()
            try:
                value = engine.eval_document(name)
                outcome, detail = ("FAIL", "false") if value is False else ("PASS", "")
            except OpaUndefinedError:
                outcome, detail = "FAIL", "undefined"
            except OpaError as exc:
                outcome, detail = "ERROR", exc.message.splitlines()[0][:200]
            ms = (time.perf_counter() - start) * 1e3
            results.append(TestResult(f"data.{name}", outcome, ms, detail))
        return TestReport(results=results)
    finally:
        engine.close()


def run_dir(path: str | Path, allowed_builtins: Iterable[str] | None = None) -> TestReport:
    """Load a policy directory and run its tests (see :func:`run_tests`)."""
    try:
        policy_set = load_policy_dir(path)
    except PolicyCompileError as exc:
        return TestReport(errors=[{"code": "load_error", "message": str(exc)}])
    return run_tests(policy_set, allowed_builtins)


def main(argv: list[str] | None = None) -> int:
    """CLI entry: ``python -m policy.rego_test_runner DIR``; returns exit status."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m policy.rego_test_runner POLICY_DIR", file=sys.stderr)
        return 2
    report = run_dir(args[0])
    print(report.render())
    if report.errors:
        return 2
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
