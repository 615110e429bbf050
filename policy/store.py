"""Operator policy management: validated, versioned changes to the policy set.

``PolicyStore(active_dir, versions_dir)`` owns a policy directory in the
layout of :mod:`policy.loader` (the active set, reloaded at start) and a
version history::

    versions_dir/00000007/record.json   the ChangeRecord (JSON)
    versions_dir/00000007/content       the new module source / data JSON
                                        (absent for a delete)

Each change: build the candidate set in memory -> check every call against
the built-in allow-list (:mod:`policy.builtins`) -> compile it and run every
Rego test (:func:`policy.rego_test_runner.run_tests`) -> refuse with
:class:`PolicyRejectedError` on any failure (the active set stays) -> apply
to the target (embedded engine swap, or remote OPA through its Policy and
Data APIs) -> write the version and the active file (atomic rename) -> call
``on_change(record)`` (the gateway forwards it to audit).

Remote OPA: an OPA whose paths are owned by bundles refuses Policy/Data API
writes under those roots (HTTP 4xx); the store then raises
:class:`PolicyTargetError` and records nothing. Manage such OPAs through
their bundle server instead.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from opa_client import AsyncOpaClient

from policy.builtins import check_modules
from policy.decision import PolicyError
from policy.loader import (
    PolicySet,
    canonical_json,
    check_data_path,
    check_module_id,
    is_test_module,
    load_policy_dir,
    sha256_text,
)
from policy.rego_test_runner import TestReport, run_tests


@dataclass(frozen=True)
class ChangeRecord:
    """One accepted change: ``who`` (operator id), ``kind`` policy|data,
    ``op`` put|delete, ``target`` (policy id or data path), SHA-256 hex
    digests of the old and new content (None when absent), ``version``
    (monotonic), ``time`` (seconds since the epoch)."""

    version: int
    who: str
    kind: Literal["policy", "data"]
    op: Literal["put", "delete"]
    target: str
    old_sha256: str | None
    new_sha256: str | None
    time: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible form (for audit and the admin API)."""
        return asdict(self)


class PolicyRejectedError(PolicyError):
    """A change was refused: it does not compile or a Rego test fails.

    ``report`` is the test report (compile ``errors`` or failing tests).
    """

    def __init__(self, message: str, report: TestReport) -> None:
        super().__init__(message)
        self.report = report


class PolicyTargetError(PolicyError):
    """The decision point refused or failed to apply a validated change."""


class PolicyNotFoundError(PolicyError, KeyError):
    """No policy module or data document with that id/path."""


class PolicyTarget(Protocol):
    """Where accepted changes are applied (EmbeddedOpa implements it)."""

    async def apply(self, change: ChangeRecord, policy_set: PolicySet) -> None:
        """Apply one change; ``policy_set`` is the complete new set."""
        ...


class RemoteOpaTarget:
    """Applies changes to a remote OPA through opa-python-client.

    Args:
        client: a started AsyncOpaClient (e.g. ``RemoteOpa.client``).
        on_applied: called after each change (e.g. ``RemoteOpa.notify_change``
            so the decision cache clears).

    Test modules are not pushed. Uploads use ``rego_compat=False`` so the
    client never rewrites policy text.
    """

    def __init__(self, client: AsyncOpaClient, on_applied: Callable[[], None] | None = None) -> None:
        self._client = client
        self._on_applied = on_applied

    async def apply(self, change: ChangeRecord, policy_set: PolicySet) -> None:
        """Push one change (raises PolicyTargetError when OPA refuses)."""
        try:
            if change.kind == "policy":
                if is_test_module(change.target):
                    return
                if change.op == "put":
                    await self._client.update_policy_from_string(
                        policy_set.modules[change.target], change.target, rego_compat=False
                    )
                else:
                    await self._client.delete_policy(change.target)
            else:
                if change.op == "put":
                    await self._client.update_or_create_data(policy_set.data_docs[change.target], change.target)
                else:
                    await self._client.delete_data(change.target)
        except Exception as exc:  # the client raises many unrelated types
            raise PolicyTargetError(f"remote OPA refused the change: {type(exc).__name__}") from None
        if self._on_applied is not None:
            self._on_applied()


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, "utf-8")
    os.replace(tmp, path)


class PolicyStore:
    """Validated, versioned policy modules and data documents.

    Args:
        active_dir: policy directory holding the active set (created empty
            if missing; loaded at start).
        versions_dir: where versions are written.
        target: where accepted changes are applied (None: disk only).
        on_change: called with each ChangeRecord after it is committed.
        allowed_builtins: built-ins modules may call (None: the default
            list, :data:`policy.builtin_allowlist.DEFAULT_ALLOWED_BUILTINS`). The
            active set is checked at start and every candidate set before it
            is compiled, tested or pushed to the target (remote OPA too).

    Raises:
        PolicyCompileError: the active directory does not load, or calls a
            built-in outside the allow-list (BuiltinNotAllowedError).
    """

    def __init__(
        self,
        active_dir: str | Path,
        versions_dir: str | Path,
        *,
        target: PolicyTarget | None = None,
        on_change: Callable[[ChangeRecord], None] | None = None,
        allowed_builtins: Iterable[str] | None = None,
    ) -> None:
        self.active_dir = Path(active_dir)
        self.versions_dir = Path(versions_dir)
        self.active_dir.mkdir(parents=True, exist_ok=True)
        self.versions_dir.mkdir(parents=True, exist_ok=True)
        self._target = target
        self._on_change = on_change
        self._allowed = None if allowed_builtins is None else frozenset(allowed_builtins)
        self._set = load_policy_dir(self.active_dir)
        check_modules(self._set.modules, self._allowed)
        versions = [int(p.name) for p in self.versions_dir.iterdir() if p.name.isdigit()]
        self.version = max(versions, default=0)
        self._lock = asyncio.Lock()
        self._listeners: list[Callable[[ChangeRecord], None]] = []

    def add_change_listener(self, callback: Callable[[ChangeRecord], None]) -> None:
        """Call ``callback(record)`` after every change made through this store (not after :meth:`adopt`)."""
        self._listeners.append(callback)

    @property
    def policy_set(self) -> PolicySet:
        """The active set."""
        return self._set

    # ------------------------------------------------------------ reads

    def list_policies(self) -> list[dict[str, Any]]:
        """``[{"id", "sha256", "test"}]`` sorted by id."""
        return [
            {"id": k, "sha256": sha256_text(v), "test": is_test_module(k)}
            for k, v in sorted(self._set.modules.items())
        ]

    def get_policy(self, module_id: str) -> str:
        """Source of a module. Raises PolicyNotFoundError."""
        try:
            return self._set.modules[module_id]
        except KeyError:
            raise PolicyNotFoundError(module_id) from None

    def list_data(self) -> list[dict[str, Any]]:
        """``[{"path", "sha256"}]`` of the data documents."""
        return [{"path": k, "sha256": sha256_text(canonical_json(v))} for k, v in sorted(self._set.data_docs.items())]

    def get_data(self, path: str) -> Any:
        """A copy of the data document at ``a/b``. Raises PolicyNotFoundError."""
        key = "/".join(check_data_path(path))
        try:
            return copy.deepcopy(self._set.data_docs[key])
        except KeyError:
            raise PolicyNotFoundError(path) from None

    # ------------------------------------------------------------ writes

    async def put_policy(self, module_id: str, source: str, who: str) -> ChangeRecord:
        """Create or replace a module (``*_test.rego`` ids are tests).

        Raises:
            ValueError: invalid id. PolicyRejectedError: compile or test
            failure. PolicyTargetError: the target refused it.
        """
        check_module_id(module_id)
        old = self._set.modules.get(module_id)
        return await self._commit(self._set.with_module(module_id, source), "policy", "put", module_id, old, source, who)

    async def delete_policy(self, module_id: str, who: str) -> ChangeRecord:
        """Remove a module (refused if the rest no longer compiles or passes)."""
        check_module_id(module_id)
        old = self.get_policy(module_id)
        return await self._commit(self._set.with_module(module_id, None), "policy", "delete", module_id, old, None, who)

    async def put_data(self, path: str, value: Any, who: str) -> ChangeRecord:
        """Create or replace the data document at ``a/b`` (a JSON object)."""
        key = "/".join(check_data_path(path))
        if not isinstance(value, dict):
            raise ValueError("a data document must be a JSON object")
        value = copy.deepcopy(value)
        old = self._set.data_docs.get(key)
        old_text = None if old is None else canonical_json(old)
        return await self._commit(self._set.with_data(key, value), "data", "put", key, old_text, canonical_json(value), who)

    async def delete_data(self, path: str, who: str) -> ChangeRecord:
        """Remove the data document at ``a/b``."""
        key = "/".join(check_data_path(path))
        old = canonical_json(self.get_data(key))
        return await self._commit(self._set.with_data(key, None), "data", "delete", key, old, None, who)

    async def _commit(
        self,
        new_set: PolicySet,
        kind: Literal["policy", "data"],
        op: Literal["put", "delete"],
        target: str,
        old_text: str | None,
        new_text: str | None,
        who: str,
    ) -> ChangeRecord:
        if not who:
            raise ValueError("a change needs an operator id")
        async with self._lock:
            report = run_tests(new_set, self._allowed)
            if not report.ok:
                raise PolicyRejectedError(f"{kind} {op} {target!r} refused", report)
            record = ChangeRecord(
                version=self.version + 1,
                who=who,
                kind=kind,
                op=op,
                target=target,
                old_sha256=sha256_text(old_text),
                new_sha256=sha256_text(new_text),
                time=time.time(),
            )
            if self._target is not None:
                await self._target.apply(record, new_set)
            vdir = self.versions_dir / f"{record.version:08d}"
            if new_text is not None:
                _atomic_write(vdir / "content", new_text)
            _atomic_write(vdir / "record.json", json.dumps(record.to_dict(), sort_keys=True))
            active = self.active_dir / target if kind == "policy" else self.active_dir / "data" / f"{target}.json"
            if new_text is None:
                active.unlink(missing_ok=True)
            else:
                _atomic_write(active, new_text)
            self._set, self.version = new_set, record.version
        if self._on_change is not None:
            self._on_change(record)
        for callback in self._listeners:
            callback(record)
        return record

    async def adopt(self, version: int, policy_set: PolicySet, who: str) -> ChangeRecord | None:
        """Adopt a whole policy set at ``version`` made by another instance (shared state, issue 16).

        Ignored (returns None) unless ``version`` is above :attr:`version`
        (forward only). The set is checked against the built-in allow-list,
        compiled and tested exactly as a local change (fail closed:
        :class:`PolicyRejectedError`, nothing changes), applied to the
        target, written as the active set and as version ``version``
        (``op="put"``, ``target="*"``), and handed to ``on_change`` (audit);
        the change listeners are not called (it is not re-published).
        """
        async with self._lock:
            if version <= self.version:
                return None
            report = run_tests(policy_set, self._allowed)
            if not report.ok:
                raise PolicyRejectedError(f"shared policy version {version} refused", report)
            record = ChangeRecord(version=version, who=who, kind="policy", op="put", target="*",
                                  old_sha256=_set_digest(self._set), new_sha256=_set_digest(policy_set),
                                  time=time.time())
            if self._target is not None:
                await self._target.apply(record, policy_set)
            vdir = self.versions_dir / f"{version:08d}"
            _atomic_write(vdir / "content", canonical_json(_set_doc(policy_set)))
            _atomic_write(vdir / "record.json", json.dumps(record.to_dict(), sort_keys=True))
            self._write_active(policy_set)
            self._set, self.version = policy_set, version
        if self._on_change is not None:
            self._on_change(record)
        return record

    def _write_active(self, policy_set: PolicySet) -> None:
        """Make the active directory hold exactly ``policy_set``."""
        for path in self.active_dir.glob("*.rego"):
            if path.name not in policy_set.modules:
                path.unlink()
        data_dir = self.active_dir / "data"
        wanted = {data_dir / f"{k}.json" for k in policy_set.data_docs if k}
        if data_dir.is_dir():
            for path in data_dir.rglob("*.json"):
                if path not in wanted:
                    path.unlink()
        for module_id, source in policy_set.modules.items():
            _atomic_write(self.active_dir / check_module_id(module_id), source)
        for key, value in policy_set.data_docs.items():
            target = data_dir / f"{'/'.join(check_data_path(key))}.json" if key else self.active_dir / "data.json"
            _atomic_write(target, canonical_json(value))
        if "" not in policy_set.data_docs:
            (self.active_dir / "data.json").unlink(missing_ok=True)

    def history(self) -> list[ChangeRecord]:
        """All committed change records, oldest first."""
        out = []
        for vdir in sorted(p for p in self.versions_dir.iterdir() if p.name.isdigit()):
            rec = vdir / "record.json"
            if rec.is_file():
                out.append(ChangeRecord(**json.loads(rec.read_text("utf-8"))))
        return out


def _set_doc(policy_set: PolicySet) -> dict[str, Any]:
    return {"modules": dict(policy_set.modules), "data": dict(policy_set.data_docs)}


def _set_digest(policy_set: PolicySet) -> str | None:
    return sha256_text(canonical_json(_set_doc(policy_set)))


def policy_set_document(policy_set: PolicySet) -> dict[str, Any]:
    """The JSON document of a whole set (``{"modules": {id: source}, "data": {path: value}}``), as shared."""
    return _set_doc(policy_set)


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


def check_policy_dir(path: str | Path) -> TestReport:
    """Offline check for ``prefixgate policy test DIR``: load, compile, run
    the Rego tests. ``report.ok`` / ``report.render()`` give the verdict."""
    from policy.rego_test_runner import run_dir

    return run_dir(path)
