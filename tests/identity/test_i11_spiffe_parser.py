"""Issue 11 item 4: one SPIFFE ID parser for the gateway and the tenant registry.

Every rule of the SPIFFE-ID spec (standards/SPIFFE-ID.md 2.1-2.3) is checked
twice: against the parser itself and against the tenant registry's config
loader, which before this change had its own, looser parser (it used
``re.match`` with ``$``, so a trailing newline passed, and it had no
255-character limit on the trust domain).
"""

from __future__ import annotations

import pytest

import gateway.identity
import gateway.identity.spiffe_id
import tenancy.spiffe_id
from tenancy.registry import TenantConfigError, TenantRegistry
from tenancy.spiffe_id import (
    InvalidSpiffeId,
    SpiffeId,
    is_valid_spiffe_id,
    parse_spiffe_id,
    parse_spiffe_id_rule,
)

# (input, reason) — one row per rule of the spec.
BAD = [
    ("", "empty"),
    ("http://example.org/x", "scheme"),
    ("SPIFFE://example.org/x", "scheme"),
    ("spiffe:/example.org/x", "scheme"),
    ("spiffe://", "trust_domain_empty"),
    ("spiffe:///x", "trust_domain_empty"),
    ("spiffe://Example.org/x", "trust_domain_char"),
    ("spiffe://ex%41mple.org/x", "trust_domain_char"),
    ("spiffe://example.org\n", "trust_domain_char"),
    ("spiffe://" + "a" * 256, "trust_domain_too_long"),
    ("spiffe://" + "a" * 256 + "/x", "trust_domain_too_long"),
    ("spiffe://example.org:8443/x", "port"),
    ("spiffe://user@example.org/x", "userinfo"),
    ("spiffe://example.org/x?y=1", "query"),
    ("spiffe://example.org/x#f", "fragment"),
    ("spiffe://example.org/a//b", "empty_segment"),
    ("spiffe://example.org/a/./b", "dot_segment"),
    ("spiffe://example.org/a/..", "dot_segment"),
    ("spiffe://example.org/.", "dot_segment"),
    ("spiffe://example.org/a%2Fb", "path_char"),
    ("spiffe://example.org/a b", "path_char"),
    ("spiffe://example.org/a\n", "path_char"),
    ("spiffe://example.org/caf\u00e9", "path_char"),
    ("spiffe://example.org/" + "a" * 2028, "too_long"),
]


@pytest.mark.parametrize("s, reason", BAD)
def test_parser_refuses_each_rule(s: str, reason: str) -> None:
    with pytest.raises(InvalidSpiffeId) as ei:
        parse_spiffe_id(s)
    assert ei.value.reason == reason
    assert not is_valid_spiffe_id(s)


@pytest.mark.parametrize("s, reason", BAD)
def test_registry_refuses_each_rule_as_exact_rule(s: str, reason: str) -> None:
    with pytest.raises(TenantConfigError, match=r"spiffe_ids"):
        TenantRegistry.from_config([{"id": "t", "spiffe_ids": [s]}])
    with pytest.raises(TenantConfigError, match=r"operators"):
        TenantRegistry.from_config([], operators=[s])


@pytest.mark.parametrize(
    "s, reason",
    [(s, r) for s, r in BAD if s and not s.endswith("\n") and r not in ("too_long", "trust_domain_empty")],
)
def test_registry_refuses_each_rule_as_prefix_rule(s: str, reason: str) -> None:
    with pytest.raises(TenantConfigError):
        TenantRegistry.from_config([{"id": "t", "spiffe_ids": [s + "/"]}])


def test_registry_resolve_fails_closed_on_each_rule() -> None:
    reg = TenantRegistry.from_config([{"id": "t", "spiffe_ids": ["spiffe://example.org/"]}])
    assert reg.resolve("spiffe://example.org/a").id == "t"
    for s, _ in BAD:
        assert reg.resolve(s) is None, s


def test_non_string_is_refused() -> None:
    for v in (None, 1, b"spiffe://td/x", ["spiffe://td/x"]):
        with pytest.raises(InvalidSpiffeId) as ei:
            parse_spiffe_id(v)  # type: ignore[arg-type]
        assert ei.value.reason == "type"
        with pytest.raises(TenantConfigError):
            TenantRegistry.from_config([{"id": "t", "spiffe_ids": [v]}])


def test_length_limit_is_2048_bytes_inclusive_for_ids_and_rules() -> None:
    base = "spiffe://example.org/"
    ok = base + "a" * (2048 - len(base))
    assert len(parse_spiffe_id(ok).uri.encode()) == 2048
    TenantRegistry.from_config([{"id": "t", "spiffe_ids": [ok]}])
    with pytest.raises(InvalidSpiffeId):
        parse_spiffe_id(ok + "a")
    rule = ok[:-1] + "/"  # 2048 bytes with the slash
    assert parse_spiffe_id_rule(rule) == (SpiffeId("example.org", ok[len(base) - 1:-1]), True)
    with pytest.raises(InvalidSpiffeId):
        parse_spiffe_id_rule(ok + "/")


def test_trust_domain_of_255_is_accepted() -> None:
    s = "spiffe://" + "a" * 255 + "/x"
    assert parse_spiffe_id(s).trust_domain == "a" * 255
    TenantRegistry.from_config([{"id": "t", "spiffe_ids": [s]}])


def test_prefix_rules() -> None:
    assert parse_spiffe_id_rule("spiffe://td/ns/a/") == (SpiffeId("td", "/ns/a"), True)
    assert parse_spiffe_id_rule("spiffe://td/") == (SpiffeId("td", ""), True)
    assert parse_spiffe_id_rule("spiffe://td/ns/a") == (SpiffeId("td", "/ns/a"), False)
    for bad in ("spiffe://td//", "spiffe://td/ns//", "spiffe:///", "spiffe://td/../"):
        with pytest.raises(InvalidSpiffeId):
            parse_spiffe_id_rule(bad)


def test_segments() -> None:
    assert SpiffeId("td", "").segments == ()
    assert parse_spiffe_id("spiffe://td/ns/a").segments == ("ns", "a")


def test_gateway_uses_the_same_parser() -> None:
    assert gateway.identity.parse_spiffe_id is tenancy.spiffe_id.parse_spiffe_id
    assert gateway.identity.spiffe_id.parse_spiffe_id is tenancy.spiffe_id.parse_spiffe_id
    assert gateway.identity.InvalidSpiffeId is tenancy.spiffe_id.InvalidSpiffeId
    assert gateway.identity.SpiffeId is tenancy.spiffe_id.SpiffeId
    assert gateway.identity.parse_trust_domain is tenancy.spiffe_id.parse_trust_domain


def test_tenancy_parser_imports_nothing_of_gateway() -> None:
    import ast
    import pathlib

    for mod in ("spiffe_id.py", "registry.py"):
        tree = ast.parse(pathlib.Path(tenancy.spiffe_id.__file__).with_name(mod).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("gateway"), (mod, node.module)
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("gateway") for a in node.names), mod
