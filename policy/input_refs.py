"""Which input fields a policy reads: the decision cache's key follows the policy (R10-2).

A cached decision is reused for every input that agrees on the cache's key fields
(:mod:`policy.cache`), so the key must cover every input field the policy can read.
:func:`policy_key_fields` derives it from the policy's own modules (OPA's JSON AST,
:func:`policy.rego_calls.parse_module`), conservatively:

- a module identical (same source text) to a module of the shipped policy
  (rego/authz.rego) reads the fields of :data:`policy.cache.DEFAULT_KEY_FIELDS` only
  (property test tests/policy/test_i13_cache_key.py); its one rule that hands an input
  subtree to other modules, ``tenant := input.tenant``, is followed: a reference to
  ``tenant.x`` (in its package) or ``data.prefixgate.authz.tenant.x`` reads ``tenant.x``;
- in any other module every reference rooted at ``input`` reads its static path
  (``input.request.prompt_tokens`` → ``request.prompt_tokens``;
  ``input.candidates[_].load`` → ``candidates[].load``); the path stops at the first
  term it cannot classify (``input.request[k]`` → the whole ``request`` subtree);
- a use it cannot bound is "the whole input": bare ``input`` (``object.get(input, ...)``,
  ``walk(input)``, ``x := input``), ``input[k]``, ``with input as ...``, a reference to
  ``data`` or to the shipped package's document as a whole, a redefinition of one of
  the shipped package's functions (whose arguments are input elements), ``time``
  (a different value at every request), and any call of OPA's non-deterministic built-ins
  (``time.*``, ``rand.*``, ``uuid.*``, ``http.send``, ``net.*``, ``opa.runtime``; review R10b-3).
  Then nothing is cached. A reference whose first term is a call, array, object or
  comprehension (``object.union(input.request, {}).prompt_tokens``, ``[input.request][0].x``)
  is scanned inside that term too (review R10b-1).

If every path is inside the default key's fields the key is the default one (the
gateway's fast key path, issue 14); otherwise it is the default key plus those paths.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from policy.cache import DEFAULT_KEY_FIELDS
from policy.rego_calls import AstWalker, ModuleMemo, package_path, parse_module

__all__ = ["WHOLE_INPUT", "covered", "module_input_paths", "policy_key_fields", "shipped_modules"]

#: what a module reads when its use of the input cannot be bounded
WHOLE_INPUT = "*"
#: the shipped policy's package and its rule that exports an input subtree (``tenant := input.tenant``)
SHIPPED_PACKAGE = ("prefixgate", "authz")
_ALIASES = {"tenant": ("tenant",)}
#: functions of the shipped package (their arguments are input elements: a redefinition reads them)
_SHIPPED_FUNCTIONS = frozenset({"alert_applies", "pool_permitted"})
#: built-in namespaces whose calls can answer differently for the same input (OPA's
#: non-deterministic built-ins: ``time.now_ns``, ``rand.intn``, ``uuid.rfc4122``, ``http.send``,
#: ``net.lookup_ip_addr``, ``opa.runtime``); any reference to them (conservatively, the deterministic
#: ``time.parse_*`` too) means "do not cache" (review R10b-3)
_NONDETERMINISTIC = frozenset({"time", "rand", "uuid", "http", "net", "opa"})
#: lists of the input whose elements a ``[_]`` iterates (``candidates[].load``)
_LISTS = frozenset({"candidates", "alerts"})

_lock = threading.Lock()
_shipped: list[frozenset[str]] = []
_memo: ModuleMemo[frozenset[str]] = ModuleMemo()


def shipped_modules() -> frozenset[str]:
    """The source texts of the shipped policy's modules (``rego/*.rego`` without tests), read once."""
    with _lock:
        if not _shipped:
            from policy.loader import load_policy_dir  # noqa: PLC0415
            from rego import policy_dir  # noqa: PLC0415

            _shipped.append(frozenset(load_policy_dir(policy_dir()).policies().values()))
        return _shipped[0]


def _path(terms: list[Any], start: tuple[str, ...]) -> str:
    parts = list(start)
    for t in terms:
        kind = t.get("type") if isinstance(t, dict) else None
        if kind == "string":
            parts.append(str(t.get("value")))
        elif kind == "var" and len(parts) == 1 and parts[0] in _LISTS:
            parts[0] += "[]"
        else:
            break
    if not parts:
        return WHOLE_INPUT
    return ".".join(parts).removesuffix("[]")  # a whole element: the whole list


class _Scan(AstWalker):
    def __init__(self, in_shipped_package: bool) -> None:
        self.local = in_shipped_package
        self.paths: set[str] = set()

    def ref(self, value: list[Any]) -> None:
        head = value[0] if value and isinstance(value[0], dict) else {}
        name = head.get("value") if head.get("type") == "var" else None
        rest = value[1:]
        if name == "input":
            self.paths.add(_path(rest, ()))
        elif name == "data":
            static = []
            for t in rest:
                if not (isinstance(t, dict) and t.get("type") == "string"):
                    break
                static.append(str(t.get("value")))
            n = len(SHIPPED_PACKAGE)
            if tuple(static[:n]) == SHIPPED_PACKAGE[:len(static[:n])] and len(static) <= n:
                self.paths.add(WHOLE_INPUT)  # data, data.prefixgate, the package's whole document
            elif tuple(static[:n]) == SHIPPED_PACKAGE and static[n] in _ALIASES:
                self.paths.add(_path(rest[n + 1:], _ALIASES[static[n]]))
        elif self.local and name in _ALIASES:
            self.paths.add(_path(rest, _ALIASES[name]))
        elif name in _NONDETERMINISTIC:
            self.paths.add(WHOLE_INPUT)  # a value that changes between requests: never cached (R10b-3)
        elif name is None:  # a call, array, object or comprehension with a path after it (R10b-1)
            self.walk(value[0])
        self.walk(rest)

    def visit(self, node: dict[str, Any]) -> bool:
        kind = node.get("type")
        if kind == "ref" and isinstance(node.get("value"), list):
            self.ref(node["value"])
            return True
        if kind == "var":
            name = node.get("value")
            if name in ("input", "data"):
                self.paths.add(WHOLE_INPUT)
            elif self.local and name in _ALIASES:
                self.paths.add(".".join(_ALIASES[name]))
            return True
        return False


def module_input_paths(module_id: str, source: str) -> frozenset[str]:
    """The input paths one module reads (dotted, ``a[].b`` for list elements; :data:`WHOLE_INPUT`
    when unbounded); a shipped module reads :data:`DEFAULT_KEY_FIELDS`. Memoized per (id, source).

    Raises :class:`policy.decision.PolicyCompileError` when the module does not parse."""
    if source in shipped_modules():
        return frozenset(DEFAULT_KEY_FIELDS)
    return _memo.get(module_id, source, lambda: _scan(parse_module(module_id, source)))


def _scan(ast: dict[str, Any]) -> frozenset[str]:
    scan = _Scan(package_path(ast) == SHIPPED_PACKAGE)
    for rule in ast.get("rules") or []:
        head = (rule.get("head") or {}) if isinstance(rule, dict) else {}
        if scan.local and head.get("args") and head.get("name") in _SHIPPED_FUNCTIONS:
            scan.paths.add(WHOLE_INPUT)
    scan.walk(ast.get("imports") or [])
    scan.walk(ast.get("rules") or [])
    return frozenset(scan.paths)


def covered(path: str, fields: Iterable[str] = DEFAULT_KEY_FIELDS) -> bool:
    """Whether the subtree at ``path`` is inside one of ``fields`` (equal to it or below it)."""
    return any(path == f or path.startswith(f + ".") for f in fields)


def policy_key_fields(modules: Mapping[str, str], extra: Iterable[str] = ()) -> tuple[str, ...] | None:
    """The decision-cache key fields for the policy ``modules`` (id -> Rego source, tests excluded)
    plus the operator's ``extra`` paths (``policy.cache_key_fields``).

    Returns :data:`DEFAULT_KEY_FIELDS` itself (the fast key) when every path read is inside it,
    the default fields plus the other paths (sorted) otherwise, and ``None`` (do not cache)
    when a module's use of the input cannot be bounded, reads ``time``, or does not parse
    (fail closed: a policy the scan cannot read is never served from the cache)."""
    paths: set[str] = set(extra)
    try:
        for module_id, source in modules.items():
            paths |= module_input_paths(module_id, source)
    except Exception:  # noqa: BLE001 - PolicyCompileError or anything unexpected: no cache
        return None
    if WHOLE_INPUT in paths or any(p == "time" or p.startswith("time.") for p in paths):
        return None
    more = sorted(p for p in paths if not covered(p))
    return DEFAULT_KEY_FIELDS if not more else (*DEFAULT_KEY_FIELDS, *more)
