"""Built-in allow-list for Rego modules: no network, no host, no randomness.

The embedded engine (``opa_bindings``) has no capabilities option: every
OPA built-in is available to every module it loads, ``http.send`` and
``net.lookup_ip_addr`` included, and registering a Python function under a
built-in's name does not replace it. So every module is checked *before*
any engine sees it (shipped ``rego/``, admin uploads, the versions
directory, at start and on each change, test modules included, in the
embedded and the remote mode):

1. parse it with OPA's own parser (the ``rego.parse_module`` built-in,
   evaluated in a separate, policy-less engine; the AST is OPA's JSON form);
2. walk the whole syntax tree and collect every function call: call terms
   (``x := f(a)``, rule heads, arguments, comprehensions, template strings,
   ``every`` domains), body statements whose terms start with a reference
   (``f(a, out)``, ``x == y``, negated ones), the ``some x in`` / ``every``
   membership calls, and the *values* of ``with`` modifiers (``with count
   as http.send`` makes ``count`` call ``http.send``);
3. refuse the set when a call names neither an allowed built-in nor a
   user function: a reference rooted at ``data`` (or at an import alias of
   ``data``), or a function defined in the same package (OPA resolves such
   names to the package's own function before any built-in).

The default list (:data:`DEFAULT_ALLOWED_BUILTINS`) holds the pure,
deterministic built-ins that do no I/O (OPA's built-in reference,
https://www.openpolicyagent.org/docs/policy-reference/builtins). Left out:
``http.send``, ``net.lookup_ip_addr`` (network); ``opa.runtime`` (host
environment); ``rego.parse_module`` (not needed by a policy);
``json.verify_schema`` / ``json.match_schema`` (a schema ``$ref`` may be
fetched over the network); ``time.now_ns``, ``rand.intn``, ``uuid.rfc4122``
(non-deterministic; decisions are cached, so a policy reads the time from
``input.time``); ``print``, ``trace`` (write to the gateway's stderr);
``io.jwt.encode_sign*``, ``providers.aws.sign_req`` (signing; not needed);
``graphql.*`` (not needed). ``policy.allowed_builtins`` extends the list.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from opa_bindings import OpaEngine, OpaError

from policy.decision import PolicyCompileError, compile_errors

__all__ = [
    "DEFAULT_ALLOWED_BUILTINS",
    "BuiltinNotAllowedError",
    "ForbiddenCall",
    "allowed_builtins",
    "check_builtin_name",
    "check_modules",
    "forbidden_calls",
    "parse_module",
]

_OPERATORS = {
    # infix operators as the parser names them
    "eq", "assign", "equal", "neq", "lt", "lte", "gt", "gte",
    "plus", "minus", "mul", "div", "rem", "and", "or",
    # the parser's names for ``x in xs`` / ``k, v in xs`` and template strings
    "internal.member_2", "internal.member_3", "internal.template_string",
}
_NUMBERS = {"abs", "ceil", "floor", "round", "numbers.range", "numbers.range_step", "to_number", "format_int"}
_AGGREGATES = {"count", "sum", "product", "max", "min", "sort", "all", "any"}
_COLLECTIONS = {
    "array.concat", "array.slice", "array.reverse", "intersection", "union",
    "object.get", "object.remove", "object.subset", "object.union", "object.union_n", "object.filter",
    "object.keys", "json.filter", "json.remove", "json.patch", "walk",
    "graph.reachable", "graph.reachable_paths",
}
_STRINGS = {
    "concat", "contains", "endswith", "indexof", "indexof_n", "lower", "upper", "replace", "split",
    "sprintf", "startswith", "substring", "trim", "trim_left", "trim_prefix", "trim_right",
    "trim_suffix", "trim_space", "strings.any_prefix_match", "strings.any_suffix_match",
    "strings.count", "strings.replace_n", "strings.reverse", "strings.render_template",
}
_REGEX_GLOB = {
    "regex.match", "re_match", "regex.is_valid", "regex.split", "regex.find_n",
    "regex.find_all_string_submatch_n", "regex.globs_match", "regex.template_match", "regex.replace",
    "glob.match", "glob.quote_meta",
}
_TYPES = {
    "is_number", "is_string", "is_boolean", "is_array", "is_set", "is_object", "is_null", "type_name",
}
_ENCODING = {
    "base64.encode", "base64.decode", "base64.is_valid", "base64url.encode", "base64url.encode_no_pad",
    "base64url.decode", "urlquery.encode", "urlquery.encode_object", "urlquery.decode",
    "urlquery.decode_object", "json.marshal", "json.marshal_with_options", "json.unmarshal",
    "json.is_valid", "yaml.marshal", "yaml.unmarshal", "yaml.is_valid", "hex.encode", "hex.decode",
}
_CRYPTO_TOKENS = {
    "crypto.md5", "crypto.sha1", "crypto.sha256",
    "crypto.hmac.md5", "crypto.hmac.sha1", "crypto.hmac.sha256", "crypto.hmac.sha512", "crypto.hmac.equal",
    "crypto.x509.parse_certificates", "crypto.x509.parse_and_verify_certificates",
    "crypto.x509.parse_and_verify_certificates_with_options", "crypto.x509.parse_certificate_request",
    "crypto.x509.parse_keypair", "crypto.x509.parse_rsa_private_key", "crypto.parse_private_keys",
    "io.jwt.decode", "io.jwt.decode_verify",
    "io.jwt.verify_es256", "io.jwt.verify_es384", "io.jwt.verify_es512",
    "io.jwt.verify_hs256", "io.jwt.verify_hs384", "io.jwt.verify_hs512",
    "io.jwt.verify_ps256", "io.jwt.verify_ps384", "io.jwt.verify_ps512",
    "io.jwt.verify_rs256", "io.jwt.verify_rs384", "io.jwt.verify_rs512", "io.jwt.verify_eddsa",
}
_MISC = {
    "bits.or", "bits.and", "bits.negate", "bits.xor", "bits.lsh", "bits.rsh",
    "units.parse", "units.parse_bytes", "semver.is_valid", "semver.compare", "uuid.parse",
    "net.cidr_contains", "net.cidr_contains_matches", "net.cidr_expand", "net.cidr_intersects",
    "net.cidr_is_valid", "net.cidr_merge", "net.cidr_overlap",
    # time arithmetic on given values (no clock read)
    "time.parse_ns", "time.parse_rfc3339_ns", "time.parse_duration_ns", "time.format", "time.date",
    "time.clock", "time.weekday", "time.add_date", "time.diff",
    "rego.metadata.chain", "rego.metadata.rule",
}

#: Built-ins every module may call (pure, deterministic, no I/O).
DEFAULT_ALLOWED_BUILTINS: frozenset[str] = frozenset(
    _OPERATORS | _NUMBERS | _AGGREGATES | _COLLECTIONS | _STRINGS | _REGEX_GLOB | _TYPES
    | _ENCODING | _CRYPTO_TOKENS | _MISC
)

_NAME = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)*$")


def check_builtin_name(name: str) -> str:
    """Validate one ``policy.allowed_builtins`` entry (a dotted lower-case name).

    Raises:
        ValueError: not a dotted name such as ``net.lookup_ip_addr``.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"invalid built-in name {name!r} (expected a dotted name like 'time.now_ns')")
    return name


def allowed_builtins(extra: Iterable[str] = ()) -> frozenset[str]:
    """The default allow-list plus ``extra`` (each checked by :func:`check_builtin_name`).

    Raises:
        ValueError: an invalid name in ``extra``.
    """
    return DEFAULT_ALLOWED_BUILTINS | {check_builtin_name(n) for n in extra}


@dataclass(frozen=True)
class ForbiddenCall:
    """One refused call: ``builtin`` (the dotted name as written, or the
    reference text when it is not a static name), ``module`` (policy id),
    ``rule`` (the enclosing rule's name), ``position`` (``call``, ``statement``
    or ``with``)."""

    builtin: str
    module: str
    rule: str
    position: str

    def to_error(self) -> dict[str, Any]:
        """OPA-style error object (``code``, ``message``, ``location.file``)."""
        return {
            "code": "rego_builtin_not_allowed",
            "message": f"rule {self.rule!r} calls built-in {self.builtin!r}, which is not allowed "
                       f"(policy.allowed_builtins)",
            "location": {"file": self.module, "row": 0, "col": 0},
            "builtin": self.builtin,
        }


class BuiltinNotAllowedError(PolicyCompileError):
    """A module calls a built-in outside the allow-list.

    ``calls``: the :class:`ForbiddenCall` list; ``errors``: their OPA-style
    error objects (code ``rego_builtin_not_allowed``); ``builtins``: the
    sorted refused names. The message names every refused built-in.
    """

    def __init__(self, calls: list[ForbiddenCall]) -> None:
        self.calls = calls
        self.builtins = sorted({c.builtin for c in calls})
        first = calls[0]
        super().__init__(
            f"{first.module}: built-in {', '.join(repr(b) for b in self.builtins)} not allowed "
            f"(rule {first.rule!r}; extend policy.allowed_builtins to permit it)"
        )
        self.errors = [c.to_error() for c in calls]


# ------------------------------------------------------------------ parsing

_parser_lock = threading.Lock()
_parser: OpaEngine | None = None


def parse_module(module_id: str, source: str) -> dict[str, Any]:
    """OPA's JSON AST of one module (Rego v1), from ``rego.parse_module``.

    The call runs in a dedicated engine that holds no policy, so parsing a
    module never evaluates any of it.

    Raises:
        PolicyCompileError: the module does not parse (``.errors`` in OPA's shape).
    """

    global _parser
    with _parser_lock:
        if _parser is None:
            _parser = OpaEngine()
        try:
            rows = _parser.eval_query("m := rego.parse_module(input.id, input.src)",
                                      {"id": module_id, "src": source})
        except OpaError as exc:
            err = PolicyCompileError(f"{module_id}: {exc.message}")
            err.errors = compile_errors(exc.message)  # type: ignore[attr-defined]
            raise err from None
    if not rows or not isinstance(rows[0].get("m"), dict):
        raise PolicyCompileError(f"{module_id}: does not parse")
    return rows[0]["m"]


# ------------------------------------------------------------------ walking

def _ref_name(ref: list[Any]) -> tuple[str, bool]:
    """Dotted text of a reference and whether it is static (var then strings)."""
    if not ref or not isinstance(ref[0], dict) or ref[0].get("type") != "var":
        return "<dynamic>", False
    parts = [str(ref[0].get("value"))]
    static = True
    for t in ref[1:]:
        if isinstance(t, dict) and t.get("type") == "string":
            parts.append(str(t.get("value")))
        else:
            parts.append("[…]")
            static = False
    return ".".join(parts), static


@dataclass
class _Module:
    module_id: str
    package: str
    aliases: dict[str, str]                 # import alias -> root ("data" / "input")
    functions: set[str]                     # dotted names of functions defined here
    calls: list[tuple[list[Any], str, str]]  # (operator ref, rule, position)
    with_vars: list[tuple[str, str]]         # (var name, rule) used as a with value


def _rule_name(rule: dict[str, Any]) -> str:
    head = rule.get("head") or {}
    ref = head.get("ref")
    if isinstance(ref, list) and ref:
        return _ref_name(ref)[0]
    return str(head.get("name", "?"))


class _Walker:
    def __init__(self, mod: _Module) -> None:
        self.mod = mod
        self.rule = "?"

    def walk(self, node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                self.walk(item)
            return
        if not isinstance(node, dict):
            return
        if node.get("type") == "call" and isinstance(node.get("value"), list) and node["value"]:
            op = node["value"][0]
            self._record(op, "call")
            self.walk(node["value"])
            return
        if "terms" in node:  # an expression (body statement, template part)
            terms = node["terms"]
            if isinstance(terms, list) and terms and isinstance(terms[0], dict) and terms[0].get("type") == "ref":
                self._record(terms[0], "statement")
            self.walk(terms)
            for w in node.get("with") or []:
                self._with(w)
            return
        for key, value in node.items():
            if key in ("comments", "annotations", "location"):
                continue
            self.walk(value)

    def _record(self, op: Any, position: str) -> None:
        if isinstance(op, dict) and op.get("type") == "ref" and isinstance(op.get("value"), list):
            self.mod.calls.append((op["value"], self.rule, position))
        else:  # a call whose operator is not a reference: refuse (fail closed)
            self.mod.calls.append(([], self.rule, position))

    def _with(self, w: Any) -> None:
        if not isinstance(w, dict):
            return
        # the target is replaced, never called; walk it for nested calls only
        self.walk(w.get("target"))
        value = w.get("value")
        if isinstance(value, dict):
            if value.get("type") == "ref":
                self._record(value, "with")
            elif value.get("type") == "var":
                self.mod.with_vars.append((str(value.get("value")), self.rule))
        self.walk(value)

    def rule_tree(self, rule: dict[str, Any]) -> None:
        while isinstance(rule, dict):
            self.rule = _rule_name(rule)
            self.walk({k: v for k, v in rule.items() if k != "else"})
            rule = rule.get("else")


def _analyse(module_id: str, ast: dict[str, Any]) -> _Module:
    pkg_path = (ast.get("package") or {}).get("path") or []
    package = ".".join(str(t.get("value")) for t in pkg_path[1:] if isinstance(t, dict))
    aliases: dict[str, str] = {}
    for imp in ast.get("imports") or []:
        path = (imp.get("path") or {}).get("value") or []
        if not path or not isinstance(path[0], dict):
            continue
        root = path[0].get("value")
        if root not in ("data", "input"):
            continue  # rego.v1, future.keywords: no alias
        alias = imp.get("alias")
        if not alias:
            last = path[-1]
            alias = last.get("value") if isinstance(last, dict) and len(path) > 1 else root
        aliases[str(alias)] = str(root)
    mod = _Module(module_id, package, aliases, set(), [], [])
    walker = _Walker(mod)
    for rule in ast.get("rules") or []:
        r = rule
        while isinstance(r, dict):
            head = r.get("head") or {}
            if head.get("args"):
                name, static = _ref_name(head.get("ref") or [])
                if static:
                    mod.functions.add(name)
            r = r.get("else")
        walker.rule_tree(rule)
    return mod


_cache_lock = threading.Lock()
_cache: dict[tuple[str, str], _Module] = {}
_CACHE_MAX = 512


def _module(module_id: str, source: str) -> _Module:
    key = (module_id, source)
    with _cache_lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit
    mod = _analyse(module_id, parse_module(module_id, source))
    with _cache_lock:
        if len(_cache) >= _CACHE_MAX:
            _cache.clear()
        _cache[key] = mod
    return mod


def forbidden_calls(modules: Mapping[str, str], allowed: Iterable[str] | None = None) -> list[ForbiddenCall]:
    """Every call in ``modules`` (id -> Rego source; the whole set, so that
    functions defined in another module of the same package resolve) that
    names neither an allowed built-in nor a user function.

    Args:
        modules: the complete set that is about to be loaded (tests included).
        allowed: the allow-list (default :data:`DEFAULT_ALLOWED_BUILTINS`).

    Raises:
        PolicyCompileError: a module does not parse.
    """
    allow = DEFAULT_ALLOWED_BUILTINS if allowed is None else frozenset(allowed)
    parsed = [_module(mid, src) for mid, src in sorted(modules.items())]
    functions: dict[str, set[str]] = {}
    for m in parsed:
        functions.setdefault(m.package, set()).update(m.functions)
    out: list[ForbiddenCall] = []
    for m in parsed:
        local = functions.get(m.package, set())
        for ref, rule, position in m.calls:
            name, static = _ref_name(ref)
            root = name.split(".", 1)[0]
            if root == "data" or m.aliases.get(root) == "data":
                continue  # a user function elsewhere in data (checked as its own module)
            if position == "with" and (root == "input" or m.aliases.get(root) == "input"):
                continue  # a with value read from input, not a function
            if static and (name in local or name in allow):
                continue
            out.append(ForbiddenCall(name, m.module_id, rule, position))
        for var, rule in m.with_vars:
            # single-word built-ins outside the default list; a var with value is
            # otherwise a local variable
            if var in ("print", "trace") and var not in allow and var not in local:
                out.append(ForbiddenCall(var, m.module_id, rule, "with"))
    return out


def check_modules(modules: Mapping[str, str], allowed: Iterable[str] | None = None) -> None:
    """Refuse a module set that calls a built-in outside ``allowed``.

    Raises:
        BuiltinNotAllowedError: naming the built-in(s), the module and rule.
        PolicyCompileError: a module does not parse.
    """
    calls = forbidden_calls(modules, allowed)
    if calls:
        raise BuiltinNotAllowedError(calls)
