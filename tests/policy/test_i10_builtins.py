"""Issue 10, finding 2: uploaded Rego must not reach the network from the gateway.

The embedded engine serves every OPA built-in (``http.send``,
``net.lookup_ip_addr`` ...) and has no capabilities option, so every module
is checked on OPA's own AST against an allow-list before any engine sees it
(``policy.builtins``). Each vector below is first shown to really call a
loopback HTTP server when the check is off, then refused (naming the
built-in) on every load path: disk (start and reload), the PolicyStore
(admin uploads, test modules included) and the Rego test runner; the
server receives nothing.
"""

from __future__ import annotations

import http.server
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from policy.builtin_allowlist import DEFAULT_ALLOWED_BUILTINS, allowed_builtins, check_builtin_name
from policy.builtins import BuiltinNotAllowedError, forbidden_calls
from policy.decision import PolicyCompileError
from policy.embedded import EmbeddedOpa
from policy.loader import build_engine, load_policy_dir
from policy.rego_test_runner import run_dir, run_tests
from policy.store import PolicyRejectedError, PolicyStore

REPO = Path(__file__).resolve().parents[2]
REGO = REPO / "rego"


class Sink:
    """A loopback HTTP server that records every request it receives."""

    def __init__(self) -> None:
        hits: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                hits.append(self.path)
                body = b'{"ok": true}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.hits = hits
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/internal"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def req(self) -> str:
        return '{"method": "GET", "url": "%s"}' % self.url


@pytest.fixture(scope="module")
def sink() -> Iterator[Sink]:
    s = Sink()
    s.thread.start()
    yield s
    s.server.shutdown()
    s.server.server_close()


# Every syntactic position a call can take. ``{R}`` is the request object.
VECTORS: dict[str, str] = {
    "body_statement_output_arg": "p if {{ http.send({R}, resp); resp.status_code == 200 }}",
    "call_term_assign": "p if {{ resp := http.send({R}); resp.status_code == 200 }}",
    "rule_head_value": "p := http.send({R})",
    "comprehension": "p := [r | some i in [1]; r := http.send({R}); i > 0]",
    "every": "p if {{ every i in [1] {{ i > 0; http.send({R}).status_code == 200 }} }}",
    "function_body": "f(req) := http.send(req)\np := f({R})",
    "with_value_call": "p if {{ input.x == 1 with input as http.send({R}) }}",
    "with_function_mock": "p if {{ json.marshal({R}) with json.marshal as http.send }}",
    "negated_statement": "p if {{ not http.send({R}) }}",
    "some_in": "p if {{ some x in http.send({R}) }}",
    "else_branch": "p := 1 if false else := http.send({R})",
    "template_string": 'p := $"{{http.send({R}).status_code}}"',
    "object_value": 'p := {{"a": http.send({R})}}',
}


def module(name: str, sink: Sink) -> str:
    return "package evil\n\n" + VECTORS[name].format(R=sink.req()) + "\n"


@pytest.mark.parametrize("name", sorted(VECTORS))
def test_each_vector_reaches_the_network_without_the_check(name: str, sink: Sink) -> None:
    """The threat is real: with the check off the engine calls the loopback server."""
    before = len(sink.hits)
    engine = build_engine({"evil.rego": module(name, sink)}, {}, check_builtins=False)
    try:
        engine.eval_query("x := data.evil.p")
    except Exception:
        pass  # some positions error after the call was made
    finally:
        engine.close()
    assert len(sink.hits) > before, f"{name}: the engine did not call out; the vector is not real"


@pytest.mark.parametrize("name", sorted(VECTORS))
def test_each_vector_is_refused_from_disk(name: str, sink: Sink, tmp_path: Path) -> None:
    pdir = tmp_path / "rego"
    shutil.copytree(REGO, pdir)
    (pdir / "evil.rego").write_text(module(name, sink))
    before = len(sink.hits)
    with pytest.raises(PolicyCompileError) as info:
        EmbeddedOpa(pdir)
    assert "http.send" in str(info.value)
    assert isinstance(info.value, BuiltinNotAllowedError)
    assert info.value.builtins == ["http.send"]
    assert len(sink.hits) == before


def test_reload_from_disk_is_refused_and_the_engine_stays(sink: Sink, tmp_path: Path, mk: object) -> None:
    pdir = tmp_path / "rego"
    shutil.copytree(REGO, pdir)
    opa = EmbeddedOpa(pdir, offload=False)
    rev = opa.revision
    (pdir / "evil.rego").write_text(module("rule_head_value", sink))
    before = len(sink.hits)
    with pytest.raises(BuiltinNotAllowedError, match="http.send"):
        opa.reload()
    assert opa.revision == rev and "evil.rego" not in opa.policy_set.modules
    assert opa.evaluate(mk())["allow"] is True  # type: ignore[operator]
    assert len(sink.hits) == before


@pytest.mark.parametrize("name", sorted(VECTORS))
async def test_each_vector_is_refused_by_the_store(name: str, sink: Sink, tmp_path: Path) -> None:
    active = tmp_path / "active"
    shutil.copytree(REGO, active)
    store = PolicyStore(active, tmp_path / "versions")
    before_list, before_version = store.list_policies(), store.version
    before = len(sink.hits)
    with pytest.raises(PolicyRejectedError) as info:
        await store.put_policy("evil.rego", module(name, sink), "spiffe://t/ops")
    assert any(e.get("builtin") == "http.send" for e in info.value.report.errors)
    assert store.list_policies() == before_list and store.version == before_version
    assert not (active / "evil.rego").exists()
    assert len(sink.hits) == before


async def test_test_modules_are_checked_before_any_test_runs(sink: Sink, tmp_path: Path) -> None:
    active = tmp_path / "active"
    shutil.copytree(REGO, active)
    store = PolicyStore(active, tmp_path / "versions")
    src = "package evil_test\n\ntest_calls_out if { http.send(%s).status_code == 200 }\n" % sink.req()
    before = len(sink.hits)
    with pytest.raises(PolicyRejectedError):
        await store.put_policy("evil_test.rego", src, "spiffe://t/ops")
    assert len(sink.hits) == before


def test_lookup_ip_addr_and_other_io_builtins_are_refused() -> None:
    for call, name in [('net.lookup_ip_addr("localhost")', "net.lookup_ip_addr"),
                       ("opa.runtime()", "opa.runtime"),
                       ('rego.parse_module("a", "package a")', "rego.parse_module"),
                       ("time.now_ns()", "time.now_ns"),
                       ("rand.intn(\"x\", 10)", "rand.intn"),
                       ('json.match_schema({}, {"$ref": "http://127.0.0.1:1/s"})', "json.match_schema"),
                       ('trace("x")', "trace")]:
        calls = forbidden_calls({"m.rego": f"package m\n\np if {{ {call} }}\n"})
        assert [c.builtin for c in calls] == [name], call
    # print as a with-value (a single word, not a reference)
    calls = forbidden_calls({"m.rego": "package m\n\np if { count([1]) == 1 with count as print }\n"})
    assert [c.builtin for c in calls] == ["print"]


def test_user_functions_imports_and_data_refs_are_allowed() -> None:
    modules = {
        "lib.rego": "package lib\n\ndouble(x) := x * 2\n",
        "a.rego": "package a\n\nimport data.lib\nimport data.lib.double as twice\n\n"
                  "helper(x) := x + 1\n"
                  "p := lib.double(helper(1))\nq := data.lib.double(2)\nr := twice(3)\n"
                  "s contains y if { some x in [1, 2]; y := helper(x) }\n"
                  "t if { every k, v in {\"a\": 1} { is_string(k); v > 0 } }\n"
                  "mycount(_) := 42\n"
                  "u := v if { v := count([1]) with count as mycount }\n",
        # a function of package a defined in another module
        "a2.rego": "package a\n\nw := helper(5)\n",
    }
    assert forbidden_calls(modules) == []
    engine = build_engine(modules, {})
    try:
        assert engine.eval_query("x := data.a.w") == [{"x": 6}]
        assert engine.eval_query("x := data.a.u") == [{"x": 42}]
    finally:
        engine.close()


def test_a_package_function_named_like_a_builtin_is_the_users() -> None:
    # OPA resolves ``http.send`` to the package's own function here (no network);
    # the check follows the same resolution.
    modules = {"a.rego": "package a\n\nhttp.send(x) := 7\n", "b.rego": "package a\n\np := http.send(1)\n"}
    assert forbidden_calls(modules) == []
    # ... but not from another package
    assert [c.builtin for c in forbidden_calls({**modules, "c.rego": "package c\n\np := http.send(1)\n"})] \
        == ["http.send"]


def test_allow_list_extension(tmp_path: Path) -> None:
    mod = {"m.rego": "package m\n\np := time.now_ns()\n"}
    with pytest.raises(BuiltinNotAllowedError, match="time.now_ns"):
        build_engine(mod, {})
    build_engine(mod, {}, allowed_builtins=allowed_builtins(["time.now_ns"])).close()
    for bad in ["", "Http.Send", "http..send", "http.send()", 3]:
        with pytest.raises(ValueError):
            check_builtin_name(bad)  # type: ignore[arg-type]


async def test_store_accepts_an_extended_builtin(tmp_path: Path) -> None:
    active = tmp_path / "active"
    shutil.copytree(REGO, active)
    src = "package clock\n\nnow := time.now_ns()\n"
    strict = PolicyStore(active, tmp_path / "v1")
    with pytest.raises(PolicyRejectedError):
        await strict.put_policy("clock.rego", src, "op")
    store = PolicyStore(active, tmp_path / "v2", allowed_builtins=allowed_builtins(["time.now_ns"]))
    rec = await store.put_policy("clock.rego", src, "op")
    assert rec.version == 1 and "clock.rego" in store.policy_set.modules


def test_store_refuses_to_start_on_a_forbidden_active_dir(tmp_path: Path, sink: Sink) -> None:
    active = tmp_path / "active"
    shutil.copytree(REGO, active)
    (active / "evil.rego").write_text(module("function_body", sink))
    with pytest.raises(BuiltinNotAllowedError):
        PolicyStore(active, tmp_path / "versions")


def test_shipped_policies_pass_the_check_and_their_tests() -> None:
    ps = load_policy_dir(REGO)
    assert forbidden_calls(ps.modules) == []
    report = run_dir(REGO)
    assert report.ok and report.passed > 0, report.render()
    assert run_tests(ps).ok
    assert "http.send" not in DEFAULT_ALLOWED_BUILTINS and "net.lookup_ip_addr" not in DEFAULT_ALLOWED_BUILTINS


def test_unparsable_module_is_a_compile_error() -> None:
    with pytest.raises(PolicyCompileError):
        build_engine({"m.rego": "package m\n\np := {\n"}, {})
