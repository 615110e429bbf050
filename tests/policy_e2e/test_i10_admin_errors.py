"""Issue 10, finding 3: every admin route's error paths answer a JSON 4xx and
change nothing.

The literal finding: an operator ``PUT /admin/data/prefixgate`` (a document
overlapping the shipped ``prefixgate/config/*`` ones) escaped the handler as
a ``PolicyCompileError`` and answered 500 in plain text. Here every admin
route gets bad input: bad JSON, wrong content type, data that breaks
compilation or a Rego test, unknown ids, bad ids, oversize bodies, a broken
config file on registry reload, an unchanged master secret, unknown routes
and methods. Each answer must be < 500 with a JSON body, and the policy
store (active files, versions, engine), the tenant registry and the key
ring must be exactly as before.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.policy_store import policy_store_section

TD = "demo.prefixgate.test"
OPERATOR = f"spiffe://{TD}/ops/admin"
ADMIN_AUD = "prefixgate-admin"
BIG = 2 * 1024 * 1024


@pytest.fixture
def config_overrides(tmp_path: Path) -> dict[str, Any]:
    return {"policy": policy_store_section(tmp_path)}


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def snapshot(stack: Any) -> dict[str, Any]:
    """Everything an admin change could touch."""
    c = stack.components
    store = c.pdp.store
    tenants = sorted(t.id for t in c.registry.tenants())
    return {
        "policies": store.list_policies(),
        "data": store.list_data(),
        "version": store.version,
        "active": _tree(store.active_dir),
        "versions": _tree(store.versions_dir),
        "engine_modules": sorted(c.pdp.inner.policy_set.modules),
        "engine_revision": c.pdp.inner.revision,
        "tenants": tenants,
        "kids": {t: c.keyring.current(t).kid for t in tenants},
        "salts": {t: c.keyring.cache_salt(t) for t in tenants},
        "keystate": _tree(stack.tmp) .get("keystate.json"),
    }


def _break_config(stack: Any) -> Callable[[], None]:
    cfg = stack.tmp / "gateway.yaml"
    original = cfg.read_text()
    cfg.write_text("tenancy: [this is: not valid\n")
    return lambda: cfg.write_text(original)


AUTHZ_BROKEN = "package prefixgate.authz\n\ndecision := {\n"
EVIL = 'package evil\n\np := http.send({"method": "GET", "url": "http://127.0.0.1:9/"})\n'

# (case id, method, path, body bytes or None, extra headers, allowed statuses, setup)
CASES: list[tuple[str, str, str, bytes | None, dict[str, str], set[int], Any]] = [
    ("data_overlaps_shipped_docs", "PUT", "/admin/data/prefixgate", b'{"x": 1}', {}, {400, 409}, None),
    ("data_overlaps_empty_object", "PUT", "/admin/data/prefixgate", b"{}", {}, {400, 409}, None),
    ("data_inside_another_doc", "PUT", "/admin/data/prefixgate/config/tiers/standard", b'{"max_tokens": 1}', {},
     {400, 409}, None),
    ("data_parent_of_docs", "PUT", "/admin/data/prefixgate/config", b'{"tiers": {}}', {}, {400, 409}, None),
    ("data_conflicts_with_rules", "PUT", "/admin/data/prefixgate/authz", b'{"decision": 1}', {},
     {400, 409}, None),
    ("data_bad_json", "PUT", "/admin/data/extra/doc", b"{not json", {}, {400}, None),
    ("data_not_object", "PUT", "/admin/data/extra/doc", b"[1, 2]", {}, {400}, None),
    ("data_nan", "PUT", "/admin/data/extra/doc", b'{"a": NaN}', {}, {400}, None),
    ("data_infinity", "PUT", "/admin/data/extra/doc", b'{"a": -Infinity}', {}, {400}, None),
    ("data_deep_nesting", "PUT", "/admin/data/extra/doc", b'{"a": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
     {}, {400, 413}, None),
    ("data_lone_surrogate", "PUT", "/admin/data/extra/doc", b'{"a": "\\ud800"}', {}, {400}, None),
    ("data_not_utf8", "PUT", "/admin/data/extra/doc", b'{"a": "\xff"}', {}, {400}, None),
    ("data_wrong_content_type", "PUT", "/admin/data/extra/doc", b'{"a": 1}', {"Content-Type": "text/plain"},
     {415}, None),
    ("data_oversize", "PUT", "/admin/data/extra/doc", b'{"a": "' + b"x" * BIG + b'"}', {}, {413}, None),
    ("data_bad_path", "PUT", "/admin/data/extra/b%20d", b'{"a": 1}', {}, {400}, None),
    ("data_empty_path", "PUT", "/admin/data/", b'{"a": 1}', {}, {400, 404}, None),
    ("data_get_unknown", "GET", "/admin/data/no/such/doc", None, {}, {404}, None),
    ("data_get_bad_path", "GET", "/admin/data/b%2Ed", None, {}, {400}, None),
    ("data_delete_not_allowed", "DELETE", "/admin/data/prefixgate/config/tiers", None, {}, {405}, None),
    ("policy_does_not_compile", "PUT", "/admin/policies/authz.rego", AUTHZ_BROKEN.encode(), {}, {400}, None),
    ("policy_forbidden_builtin", "PUT", "/admin/policies/evil.rego", EVIL.encode(), {}, {400}, None),
    ("policy_not_utf8", "PUT", "/admin/policies/x.rego", b"package x\n\np := \"\xff\"\n", {}, {400}, None),
    ("policy_nul_byte", "PUT", "/admin/policies/x.rego", b"package x\n\np := 1\x00\n", {}, {400}, None),
    ("policy_wrong_content_type", "PUT", "/admin/policies/x.rego", b"package x\n\np := 1\n",
     {"Content-Type": "application/json"}, {415}, None),
    ("policy_oversize", "PUT", "/admin/policies/x.rego", b"package x\n\n# " + b"x" * BIG, {}, {413}, None),
    ("policy_bad_id", "PUT", "/admin/policies/x.txt", b"package x\n\np := 1\n", {}, {400}, None),
    ("policy_dotdot_id", "PUT", "/admin/policies/..rego", b"package x\n\np := 1\n", {}, {400}, None),
    ("policy_get_unknown", "GET", "/admin/policies/nope.rego", None, {}, {404}, None),
    ("policy_delete_unknown", "DELETE", "/admin/policies/nope.rego", None, {}, {404}, None),
    ("policy_delete_breaks_tests", "DELETE", "/admin/policies/authz.rego", None, {}, {400}, None),
    ("policy_method", "PATCH", "/admin/policies/authz.rego", b"x", {}, {405}, None),
    ("tenant_unknown_rotate_key", "POST", "/admin/tenants/nope/rotate-key", None, {}, {404}, None),
    ("tenant_bad_id_rotate_salt", "POST", "/admin/tenants/-bad/rotate-salt", None, {}, {400}, None),
    ("reload_broken_config", "POST", "/admin/tenants/reload", None, {}, {400}, _break_config),
    ("master_unchanged", "POST", "/admin/keys/rotate-master", None, {}, {409}, None),
    ("rotate_key_wrong_method", "GET", "/admin/tenants/tenant-a/rotate-key", None, {}, {405}, None),
    ("unknown_admin_route", "GET", "/admin/nope", None, {}, {404}, None),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
async def test_admin_bad_input_is_a_json_4xx_and_changes_nothing(stack: Any, case: Any) -> None:
    name, method, path, body, headers, statuses, setup = case
    before = snapshot(stack)
    restore = setup(stack) if setup is not None else None
    try:
        h = {"Authorization": f"Bearer {stack.issuer.mint(OPERATOR, ADMIN_AUD)}", **headers}
        async with httpx.AsyncClient(base_url=stack.admin_url, timeout=30) as admin:
            r = await admin.request(method, path, headers=h, content=body)
    finally:
        if restore is not None:
            restore()
    assert r.status_code < 500, (name, r.status_code, r.text[:300])
    assert r.status_code in statuses, (name, r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/json"), (name, r.headers, r.text[:200])
    doc = r.json()
    assert isinstance(doc, dict) and doc, name
    assert snapshot(stack) == before, name
    # the gateway still routes with the shipped policy
    ok = await stack.client.post("/v1/completions", headers=stack.auth(),
                                 json={"model": "sim-model", "prompt": "hello there", "max_tokens": 2})
    assert ok.status_code == 200, ok.text


async def test_literal_finding_answers_policy_rejected(stack: Any) -> None:
    """``PUT /admin/data/prefixgate`` names the overlap in a JSON error."""
    h = {"Authorization": f"Bearer {stack.issuer.mint(OPERATOR, ADMIN_AUD)}"}
    async with httpx.AsyncClient(base_url=stack.admin_url, timeout=30) as admin:
        r = await admin.put("/admin/data/prefixgate", headers=h, content=json.dumps({"config": {}}).encode())
    assert r.status_code == 400
    doc = r.json()["error"]
    assert doc["code"] == "policy_rejected" and "overlap" in json.dumps(doc["errors"])


async def test_http_send_in_every_position_is_refused_via_the_admin_api(stack: Any) -> None:
    """Finding 2 through the operator API: each position refused with the
    built-in's name, nothing stored, the loopback target never called."""
    import http.server
    import threading

    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            hits.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    req = '{"method": "GET", "url": "http://127.0.0.1:%d/internal"}' % srv.server_address[1]
    vectors = {
        "body_statement_output_arg": "p if {{ http.send({R}, resp); resp.status_code == 200 }}",
        "call_term": "p if {{ resp := http.send({R}); resp.status_code == 200 }}",
        "rule_head_value": "p := http.send({R})",
        "comprehension": "p := [r | some i in [1]; r := http.send({R}); i > 0]",
        "every": "p if {{ every i in [1] {{ i > 0; http.send({R}).status_code == 200 }} }}",
        "function_body": "f(req) := http.send(req)\np := f({R})",
        "nested_in_with": "p if {{ input.x == 1 with input as http.send({R}) }}",
        "with_function_mock": "p if {{ json.marshal({R}) with json.marshal as http.send }}",
        "test_module": "test_p if {{ http.send({R}).status_code == 200 }}",
    }
    h = {"Authorization": f"Bearer {stack.issuer.mint(OPERATOR, ADMIN_AUD)}"}
    try:
        before = snapshot(stack)
        async with httpx.AsyncClient(base_url=stack.admin_url, timeout=30) as admin:
            for name, body in vectors.items():
                mid = "evil_test.rego" if name == "test_module" else "evil.rego"
                pkg = "evil_test" if name == "test_module" else "evil"
                src = f"package {pkg}\n\n" + body.format(R=req) + "\n"
                r = await admin.put(f"/admin/policies/{mid}", headers=h, content=src.encode())
                assert r.status_code == 400, (name, r.text[:300])
                doc = r.json()["error"]
                assert doc["code"] == "policy_rejected", name
                assert [e.get("builtin") for e in doc["errors"]] and all(
                    e.get("builtin") == "http.send" for e in doc["errors"]), (name, doc["errors"])
        assert snapshot(stack) == before
        assert hits == []
    finally:
        srv.shutdown()
        srv.server_close()


class TestAllowedBuiltinsConfig:
    @pytest.fixture
    def config_overrides(self, tmp_path: Path) -> dict[str, Any]:
        return {"policy": policy_store_section(tmp_path, allowed_builtins=["time.now_ns"])}

    async def test_an_extra_builtin_from_config_is_accepted(self, stack: Any) -> None:
        h = {"Authorization": f"Bearer {stack.issuer.mint(OPERATOR, ADMIN_AUD)}"}
        async with httpx.AsyncClient(base_url=stack.admin_url, timeout=30) as admin:
            ok = await admin.put("/admin/policies/clock.rego", headers=h,
                                 content=b"package clock\n\nnow := time.now_ns()\n")
            assert ok.status_code == 200, ok.text
            bad = await admin.put("/admin/policies/net.rego", headers=h,
                                  content=b'package net_probe\n\nip := net.lookup_ip_addr("localhost")\n')
            assert bad.status_code == 400 and "net.lookup_ip_addr" in bad.text


def test_allowed_builtins_config_is_validated(tmp_path: Path) -> None:
    from gateway.config import ConfigError, load_config

    cfg = tmp_path / "g.yaml"
    cfg.write_text("policy:\n  allowed_builtins: ['http.send()']\n")
    with pytest.raises(ConfigError, match="allowed_builtins"):
        load_config(cfg)
