"""One dotted-error-path helper (session 4): ``audit.config_errors`` turns a pydantic error into
``dotted.key: message`` for both the gateway's config loader and the audit section's own parser
(audit may not import gateway; gateway imports audit). The copies in gateway/config.py and
audit/config_schema.py are gone, and both loaders word the same problem the same way."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from audit.config_errors import key_path, pydantic_problem
from audit.config_schema import AuditConfigError, parse_audit
from gateway.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]


def _functions(path: str) -> set[str]:
    tree = ast.parse((ROOT / path).read_text())
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_no_copy_of_the_helper_is_left() -> None:
    for path in ("gateway/config.py", "audit/config_schema.py"):
        assert not {"_problem", "_key_path"} & _functions(path), path


def test_key_path_skips_a_union_tag_and_walks_lists() -> None:
    data = {"routing": {"policy": {"prefix_weight": "x"}}, "replicas": [{"id": "a"}, {"url": 3}]}
    assert key_path(("routing", "policy", "cache_aware", "prefix_weight"), data) == \
        ["routing", "policy", "prefix_weight"]
    assert key_path(("replicas", 1, "url"), data) == ["replicas", 1, "url"]
    assert key_path(("from_env", "x"), data) == ["from_env", "x"]  # not in data: kept as is


def test_problem_wording() -> None:
    err = {"type": "extra_forbidden", "loc": ("summary", "bogus"), "msg": "Extra inputs are not permitted"}
    assert pydantic_problem(err, {"summary": {"bogus": 1}}, prefix="audit") == "audit.summary.bogus: unknown field"
    err = {"type": "value_error", "loc": (), "msg": "Value error, two things clash"}
    assert pydantic_problem(err, {}) == "two things clash"
    err = {"type": "assertion_error", "loc": ("a",), "msg": "Assertion failed, bad a"}
    assert pydantic_problem(err, {"a": 1}, prefix="audit") == "audit.a: bad a"


@pytest.mark.parametrize("doc", [
    {"summary": {"window_s": -1}},           # inside a tagged union (``on``)
    {"jsonl": {"dir": "/tmp/x", "nope": 1}},  # unknown key
])
def test_both_loaders_word_an_audit_problem_alike(doc: dict, tmp_path: Path) -> None:
    with pytest.raises(AuditConfigError) as own:
        parse_audit(doc)
    with pytest.raises(ConfigError) as whole:
        load_config(None, {"audit": doc})
    assert str(own.value) in str(whole.value), (str(own.value), str(whole.value))
