"""Every function call a Rego module makes, read from OPA's own AST (steps 1 and 2 of :mod:`policy.builtins`).

:func:`parse_module` parses with OPA's parser (``rego.parse_module`` in a
separate, policy-less engine); :func:`analysed_module` walks the whole syntax
tree and collects every call term, reference statement, membership call and
``with`` value, with the enclosing rule, plus the package's own functions and
import aliases. Deciding which calls are allowed is :mod:`policy.builtins`.

:class:`AstWalker`, :func:`package_path` and :class:`ModuleMemo` are the AST walk, the package
name and the per-module memo shared with :mod:`policy.input_refs` (the decision cache's key).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from opa_bindings import OpaEngine, OpaError

from policy.decision import PolicyCompileError, compile_errors

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

#: keys of an AST object that hold no Rego term: source positions, comments, metadata annotations
SKIP_KEYS = frozenset({"location", "comments", "annotations"})


class AstWalker:
    """Depth-first walk of OPA's JSON AST (:func:`parse_module`'s output): a list item by item, an
    object through :meth:`visit` and then, unless it answered True, through each value except
    those of :data:`SKIP_KEYS`. Subclasses override :meth:`visit` (this module's call collector,
    :mod:`policy.input_refs`'s input-path scan)."""

    def walk(self, node: Any) -> None:
        """Walk ``node`` (any JSON value) and everything below it."""
        if isinstance(node, list):
            for item in node:
                self.walk(item)
            return
        if not isinstance(node, dict) or self.visit(node):
            return
        for key, value in node.items():
            if key not in SKIP_KEYS:
                self.walk(value)

    def visit(self, node: dict[str, Any]) -> bool:
        """Look at one object node; True when it is handled (its values are not walked)."""
        return False


def package_path(ast: dict[str, Any]) -> tuple[str, ...]:
    """The package of a parsed module as names (``package team.routing`` -> ``("team", "routing")``;
    ``()`` when it has none)."""
    path = (ast.get("package") or {}).get("path") or []
    return tuple(str(t.get("value")) for t in path[1:] if isinstance(t, dict))


T = TypeVar("T")
_ABSENT = object()


class ModuleMemo(Generic[T]):
    """What a module's source yields, kept per (module id, source): thread-safe, at most
    ``max_entries`` entries (cleared whole when full; policy sets are small). The value is
    computed outside the lock (two threads may both compute it once)."""

    def __init__(self, max_entries: int = 512) -> None:
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], T] = {}

    def get(self, module_id: str, source: str, compute: Callable[[], T]) -> T:
        """The value for (``module_id``, ``source``), from ``compute()`` the first time (what it
        raises propagates and nothing is kept)."""
        key = (module_id, source)
        with self._lock:
            hit = self._entries.get(key, _ABSENT)
        if hit is not _ABSENT:
            return hit  # type: ignore[return-value]
        value = compute()
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[key] = value
        return value

    def __len__(self) -> int:
        return len(self._entries)


def ref_name(ref: list[Any]) -> tuple[str, bool]:
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
class AnalysedModule:
    """What one module calls and defines: its package, import aliases, own
    functions, every call ``(operator ref, rule, position)`` and every variable
    used as a ``with`` value."""

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
        return ref_name(ref)[0]
    return str(head.get("name", "?"))


class _Walker(AstWalker):
    def __init__(self, mod: AnalysedModule) -> None:
        self.mod = mod
        self.rule = "?"

    def visit(self, node: dict[str, Any]) -> bool:
        if node.get("type") == "call" and isinstance(node.get("value"), list) and node["value"]:
            op = node["value"][0]
            self._record(op, "call")
            self.walk(node["value"])
            return True
        if "terms" in node:  # an expression (body statement, template part)
            terms = node["terms"]
            if isinstance(terms, list) and terms and isinstance(terms[0], dict) and terms[0].get("type") == "ref":
                self._record(terms[0], "statement")
            self.walk(terms)
            for w in node.get("with") or []:
                self._with(w)
            return True
        return False

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


def _analyse(module_id: str, ast: dict[str, Any]) -> AnalysedModule:
    package = ".".join(package_path(ast))
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
    mod = AnalysedModule(module_id, package, aliases, set(), [], [])
    walker = _Walker(mod)
    for rule in ast.get("rules") or []:
        r = rule
        while isinstance(r, dict):
            head = r.get("head") or {}
            if head.get("args"):
                name, static = ref_name(head.get("ref") or [])
                if static:
                    mod.functions.add(name)
            r = r.get("else")
        walker.rule_tree(rule)
    return mod


_analysed: ModuleMemo[AnalysedModule] = ModuleMemo()


def analysed_module(module_id: str, source: str) -> AnalysedModule:
    """The calls, functions and import aliases of one module (parsed and walked
    once per (id, source); a bounded cache). Raises :class:`PolicyCompileError`
    when the module does not parse."""
    return _analysed.get(module_id, source, lambda: _analyse(module_id, parse_module(module_id, source)))
