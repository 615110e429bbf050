"""Policy sets on disk and compiled embedded OPA engines.

Layout of a policy directory (the shipped one is ``rego/``)::

    *.rego                  policy modules (id = file name)
    *_test.rego             Rego unit tests (loaded for tests only)
    data/<a>/<b>/<c>.json   data document mounted at data.a.b.c
    data.json               (optional) document merged at the root
    .pg-journal/undo.json   (only while a store's change is uncommitted, or after a crash in one)

While ``.pg-journal`` exists, :func:`load_policy_dir` reads the set it records (the set *before*
an uncommitted change of :class:`policy.store.PolicyStore`, :mod:`policy.store_disk`) instead of
the files, so every reader sees the last committed set whatever a crash left half renamed.

The embedded engine can only add policies and merge data, so every change
builds a new engine (:func:`build_engine`) that is swapped in by the caller.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opa_bindings import OpaEngine, OpaError

from policy.decision import PolicyCompileError, compile_errors

_MODULE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\.rego$")
_DATA_SEGMENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,63}$")


def sha256_text(text: str | None) -> str | None:
    """Hex SHA-256 of UTF-8 text, or None for an absent document."""
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


def canonical_json(value: Any) -> str:
    """Canonical JSON (sorted keys, no spaces) used for data digests and files."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def is_test_module(module_id: str) -> bool:
    """True for Rego unit-test modules (``*_test.rego``, as ``opa test``)."""
    return module_id.endswith("_test.rego")


def check_module_id(module_id: str) -> str:
    """Validate a policy id (a flat file name ending in ``.rego``).

    Raises:
        ValueError: not a safe flat ``*.rego`` name.
    """
    if not _MODULE_ID.match(module_id) or ".." in module_id:
        raise ValueError(f"invalid policy id {module_id!r}")
    return module_id


def check_data_path(path: str) -> tuple[str, ...]:
    """Split and validate a data path ``a/b/c`` into its segments.

    Raises:
        ValueError: empty path or a segment outside ``[A-Za-z0-9_-]``.
    """
    segments = tuple(s for s in path.strip("/").split("/") if s)
    if not segments or not all(_DATA_SEGMENT.match(s) for s in segments):
        raise ValueError(f"invalid data path {path!r}")
    return segments


@dataclass(frozen=True)
class PolicySet:
    """Policy modules and data documents, as loaded from a directory.

    ``modules``: id -> Rego source (tests included; see :meth:`policies`).
    ``data_docs``: data path ``a/b`` -> JSON value, mounted at ``data.a.b``;
    the empty path ``""`` is merged at the root.
    """

    modules: Mapping[str, str] = field(default_factory=dict)
    data_docs: Mapping[str, Any] = field(default_factory=dict)

    def policies(self) -> dict[str, str]:
        """Modules without the ``*_test.rego`` ones."""
        return {k: v for k, v in self.modules.items() if not is_test_module(k)}

    def tests(self) -> dict[str, str]:
        """Only the ``*_test.rego`` modules."""
        return {k: v for k, v in self.modules.items() if is_test_module(k)}

    def data_tree(self) -> dict[str, Any]:
        """The data documents merged into one tree.

        Raises:
            PolicyCompileError: one document's path lies inside another's.
        """
        tree: dict[str, Any] = {}
        for path in sorted(self.data_docs, key=lambda p: p.count("/")):
            value = self.data_docs[path]
            if path == "":
                if not isinstance(value, dict):
                    raise PolicyCompileError("root data document must be an object")
                for k, v in value.items():
                    if k in tree:
                        raise PolicyCompileError(f"data key {k!r} defined twice")
                    tree[k] = v
                continue
            *parents, leaf = path.split("/")
            node = tree
            for seg in parents:
                nxt = node.setdefault(seg, {})
                if not isinstance(nxt, dict):
                    raise PolicyCompileError(f"data path {path!r} overlaps another document")
                node = nxt
            if leaf in node:
                raise PolicyCompileError(f"data path {path!r} overlaps another document")
            node[leaf] = value
        return tree

    def with_module(self, module_id: str, source: str | None) -> PolicySet:
        """Copy with one module replaced (``None`` removes it)."""
        mods = dict(self.modules)
        if source is None:
            mods.pop(module_id, None)
        else:
            mods[module_id] = source
        return PolicySet(mods, dict(self.data_docs))

    def with_data(self, path: str, value: Any | None) -> PolicySet:
        """Copy with one data document replaced (``None`` removes it)."""
        docs = dict(self.data_docs)
        if value is None:
            docs.pop(path, None)
        else:
            docs[path] = value
        return PolicySet(dict(self.modules), docs)


def load_policy_dir(path: str | Path, *data_files: str | Path) -> PolicySet:
    """Read a policy directory (layout in the module docstring).

    Args:
        path: the directory.
        data_files: extra JSON files merged at the data root.

    Raises:
        PolicyCompileError: unreadable JSON, an invalid file name or an unreadable change journal.
    """
    root = Path(path)
    if not root.is_dir():
        raise PolicyCompileError(f"policy directory {root} does not exist")
    committed = _journal_set(root)
    if committed is not None:
        modules, docs = dict(committed.modules), dict(committed.data_docs)
    else:
        modules, docs = {p.name: p.read_text("utf-8") for p in sorted(root.glob("*.rego"))}, {}
    try:
        data_dir = root / "data"
        if committed is None and data_dir.is_dir():
            for f in sorted(data_dir.rglob("*.json")):
                rel = f.relative_to(data_dir).with_suffix("").as_posix()
                check_data_path(rel)
                docs[rel] = json.loads(f.read_text("utf-8"))
        root_files = [*([] if committed is not None else [root / "data.json"]), *map(Path, data_files)]
        for f in root_files:
            if f.is_file():
                merged = docs[""] = dict(docs.get("", {}))
                value = json.loads(f.read_text("utf-8"))
                if not isinstance(value, dict):
                    raise PolicyCompileError(f"{f}: root data must be an object")
                merged.update(value)
            elif f != root / "data.json":
                raise PolicyCompileError(f"data file {f} does not exist")
    except (ValueError, OSError) as exc:
        raise PolicyCompileError(f"cannot load data: {exc}") from None
    return PolicySet(modules, docs)


#: the directory of an uncommitted change's journal inside a policy directory (policy/store_disk.py)
JOURNAL = ".pg-journal"


def _journal_set(root: Path) -> PolicySet | None:
    """The set an armed journal records (the last committed one), None without a journal.

    Raises:
        PolicyCompileError: a journal that cannot be read (fail closed: which set is committed is unknown).
    """
    journal = root / JOURNAL
    if not journal.exists():
        return None
    try:
        return policy_set_from_document(json.loads((journal / "undo.json").read_text("utf-8"))["set"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PolicyCompileError(f"{journal}: unreadable change journal ({exc.__class__.__name__})") from None


def policy_set_document(policy_set: PolicySet) -> dict[str, Any]:
    """The JSON document of a whole set (``{"modules": {id: source}, "data": {path: value}}``), as shared."""
    return {"modules": dict(policy_set.modules), "data": dict(policy_set.data_docs)}


def policy_set_from_document(doc: Any) -> PolicySet:
    """Inverse of :func:`policy_set_document`; raises ``ValueError`` for another shape or an unsafe id/path."""
    if not isinstance(doc, dict) or not isinstance(doc.get("modules"), dict) or not isinstance(doc.get("data"), dict):
        raise ValueError("a policy set document needs 'modules' and 'data' objects")
    modules = {}
    for k, v in doc["modules"].items():
        if not isinstance(v, str):
            raise ValueError("module sources must be strings")
        modules[check_module_id(k)] = v
    data = {}
    for k, v in doc["data"].items():
        if k:
            check_data_path(k)
        data[k] = v
    return PolicySet(modules=modules, data_docs=data)


def build_engine(
    modules: Mapping[str, str],
    data: Mapping[str, Any],
    *,
    allowed_builtins: Iterable[str] | None = None,
    check_builtins: bool = True,
) -> OpaEngine:
    """Build and compile a new embedded engine.

    Before any module reaches the engine, the whole set is parsed with OPA's
    parser and every call is checked against the built-in allow-list
    (:func:`policy.builtins.check_modules`): the engine has no capabilities
    option, so this is what keeps ``http.send`` and friends out.

    Args:
        modules: id -> Rego source (v1 syntax).
        data: the data tree, merged at the root.
        allowed_builtins: the allow-list (None: the default,
            :data:`policy.builtin_allowlist.DEFAULT_ALLOWED_BUILTINS`).
        check_builtins: False only for :mod:`tests.support.opa_server`, the
            stand-in for an OPA server started without ``--capabilities``.

    Returns:
        A ready engine (all modules compiled).

    Raises:
        PolicyCompileError: parse, type or merge error; ``.errors`` holds
            OPA-style error objects.
        policy.builtins.BuiltinNotAllowedError: a module calls a built-in
            outside the allow-list (a PolicyCompileError naming it).
    """
    if check_builtins:
        from policy.builtins import check_modules

        check_modules(modules, allowed_builtins)
    engine = OpaEngine()
    try:
        for module_id, source in modules.items():
            engine.add_policy(module_id, source)
        if data:
            engine.add_data(dict(data))
        # add_policy only parses; compilation happens on the first eval.
        engine.eval_query("x := 1")
    except OpaError as exc:
        engine.close()
        err = PolicyCompileError(exc.message)
        err.errors = compile_errors(exc.message)  # type: ignore[attr-defined]
        raise err from None
    return engine
