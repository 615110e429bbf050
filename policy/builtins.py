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

The default list is :data:`policy.builtin_allowlist.DEFAULT_ALLOWED_BUILTINS`
(the reasons for what it leaves out are there); parsing and walking the
modules is :mod:`policy.rego_calls`. This module's one job is the decision:
which calls are refused, and the error that names them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from policy.builtin_allowlist import DEFAULT_ALLOWED_BUILTINS
from policy.decision import PolicyCompileError
from policy.rego_calls import analysed_module, ref_name

__all__ = [
    "BuiltinNotAllowedError",
    "ForbiddenCall",
    "check_modules",
    "forbidden_calls",
]


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
    parsed = [analysed_module(mid, src) for mid, src in sorted(modules.items())]
    functions: dict[str, set[str]] = {}
    for m in parsed:
        functions.setdefault(m.package, set()).update(m.functions)
    out: list[ForbiddenCall] = []
    for m in parsed:
        local = functions.get(m.package, set())
        for ref, rule, position in m.calls:
            name, static = ref_name(ref)
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
