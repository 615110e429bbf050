"""Operator policy management: validated, versioned changes to the policy set.

``PolicyStore(active_dir, versions_dir)`` owns a policy directory in the
layout of :mod:`policy.loader` (the active set, reloaded at start) and a
version history::

    versions_dir/00000007/record.json   the ChangeRecord (JSON)
    versions_dir/00000007/content       the new module source / data JSON
                                        (absent for a delete)

Each change: build the candidate set in memory -> check every call against
the built-in allow-list (:mod:`policy.builtins`) -> compile it and run every
Rego test (:func:`policy.rego_test_runner.run_tests`, in a worker thread)
-> refuse with :class:`PolicyRejectedError` on any failure (the active set
stays) -> write the version and the active file under temporary names
(:mod:`policy.store_disk`) -> apply to the target (embedded engine swap, or
remote OPA through its Policy and Data APIs) -> rename them in place -> call
``on_change(record)`` (the gateway forwards it to audit). The candidate is
built under the store's lock from the set it replaces (S17-4); a change that
cannot be written is never applied (S17-5).

Remote OPA: an OPA whose paths are owned by bundles refuses Policy/Data API
writes under those roots (HTTP 4xx); the store then raises
:class:`PolicyTargetError` and records nothing. Manage such OPAs through
their bundle server instead.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
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
from policy.store_disk import StagedFiles, active_files, policy_set_document, set_digest

log = logging.getLogger(__name__)


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
            failure. PolicyTargetError: the target refused it. OSError: the
            version or the active file cannot be written (nothing applied).
        """
        check_module_id(module_id)
        return await self._commit(
            lambda s: (s.with_module(module_id, source), s.modules.get(module_id), source),
            "policy", "put", module_id, who)

    async def delete_policy(self, module_id: str, who: str) -> ChangeRecord:
        """Remove a module (refused if the rest no longer compiles or passes)."""
        check_module_id(module_id)

        def change(s: PolicySet) -> tuple[PolicySet, str | None, str | None]:
            if module_id not in s.modules:
                raise PolicyNotFoundError(module_id)
            return s.with_module(module_id, None), s.modules[module_id], None

        return await self._commit(change, "policy", "delete", module_id, who)

    async def put_data(self, path: str, value: Any, who: str) -> ChangeRecord:
        """Create or replace the data document at ``a/b`` (a JSON object)."""
        key = "/".join(check_data_path(path))
        if not isinstance(value, dict):
            raise ValueError("a data document must be a JSON object")
        value = copy.deepcopy(value)
        text = canonical_json(value)

        def change(s: PolicySet) -> tuple[PolicySet, str | None, str | None]:
            old = s.data_docs.get(key)
            return s.with_data(key, value), None if old is None else canonical_json(old), text

        return await self._commit(change, "data", "put", key, who)

    async def delete_data(self, path: str, who: str) -> ChangeRecord:
        """Remove the data document at ``a/b``."""
        key = "/".join(check_data_path(path))

        def change(s: PolicySet) -> tuple[PolicySet, str | None, str | None]:
            if key not in s.data_docs:
                raise PolicyNotFoundError(path)
            return s.with_data(key, None), canonical_json(s.data_docs[key]), None

        return await self._commit(change, "data", "delete", key, who)

    async def _commit(
        self,
        change: Callable[[PolicySet], tuple[PolicySet, str | None, str | None]],
        kind: Literal["policy", "data"],
        op: Literal["put", "delete"],
        target: str,
        who: str,
    ) -> ChangeRecord:
        """One change: ``change(current set) -> (new set, old text, new text)``, run under the lock
        (S17-4: the candidate is built on the set it replaces); tests off the loop (S17-7)."""
        if not who:
            raise ValueError("a change needs an operator id")
        async with self._lock:
            new_set, old_text, new_text = change(self._set)
            report = await asyncio.to_thread(run_tests, new_set, self._allowed)
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
            vdir = self.versions_dir / f"{record.version:08d}"
            active = self.active_dir / target if kind == "policy" else self.active_dir / "data" / f"{target}.json"
            files: dict[Path, str | None] = {} if new_text is None else {vdir / "content": new_text}
            files[active] = new_text
            files[vdir / "record.json"] = json.dumps(record.to_dict(), sort_keys=True)
            undo = replace(record, op="put" if old_text is not None else "delete",
                           old_sha256=record.new_sha256, new_sha256=record.old_sha256)
            await self._persist_and_apply(record, new_set, files, undo)
            self._set, self.version = new_set, record.version
        if self._on_change is not None:
            self._on_change(record)
        for callback in self._listeners:
            callback(record)
        return record

    async def _persist_and_apply(self, record: ChangeRecord, new_set: PolicySet,
                                 files: dict[Path, str | None], undo: ChangeRecord) -> None:
        """Stage ``files``, apply ``new_set`` to the target, then rename (S17-5: nothing in force that
        is not on disk). A failed write applies nothing; a failed rename re-applies the current set
        (``undo``: the inverse change) and rewrites its active files, then raises.

        Raises:
            OSError: the version exists already or a file cannot be written or renamed.
            PolicyTargetError: the target refused the change (nothing written).
        """
        vdir = self.versions_dir / f"{record.version:08d}"
        if vdir.exists() or vdir.is_symlink():
            raise FileExistsError(f"policy version directory {vdir} exists already")
        staged = StagedFiles(files)
        try:
            if self._target is not None:
                await self._target.apply(record, new_set)
        except BaseException:
            staged.discard()
            raise
        try:
            staged.commit()
        except OSError:
            staged.discard()
            log.error("policy version %d could not be written; re-applying version %d", record.version, self.version)
            if self._target is not None:
                await self._target.apply(undo, self._set)
            StagedFiles(active_files(self.active_dir, self._set)).commit()
            raise

    async def adopt(self, version: int, policy_set: PolicySet, who: str) -> ChangeRecord | None:
        """Adopt a whole policy set at ``version`` made by another instance (shared state, issue 16).

        Ignored (returns None) unless ``version`` is above :attr:`version`
        (forward only). The set is checked against the built-in allow-list,
        compiled and tested exactly as a local change (fail closed:
        :class:`PolicyRejectedError`, nothing changes), staged on disk as the
        active set and as version ``version`` (``op="put"``, ``target="*"``),
        applied to the target, renamed in place (as a local change, S17-5),
        and handed to ``on_change`` (audit); the change listeners are not
        called (it is not re-published).

        Raises:
            PolicyRejectedError, PolicyTargetError, OSError: nothing adopted.
        """
        async with self._lock:
            if version <= self.version:
                return None
            report = await asyncio.to_thread(run_tests, policy_set, self._allowed)
            if not report.ok:
                raise PolicyRejectedError(f"shared policy version {version} refused", report)
            record = ChangeRecord(version=version, who=who, kind="policy", op="put", target="*",
                                  old_sha256=set_digest(self._set), new_sha256=set_digest(policy_set),
                                  time=time.time())
            vdir = self.versions_dir / f"{version:08d}"
            files: dict[Path, str | None] = {vdir / "content": canonical_json(policy_set_document(policy_set))}
            files.update(active_files(self.active_dir, policy_set))
            files[vdir / "record.json"] = json.dumps(record.to_dict(), sort_keys=True)
            undo = replace(record, old_sha256=record.new_sha256, new_sha256=record.old_sha256)
            await self._persist_and_apply(record, policy_set, files, undo)
            self._set, self.version = policy_set, version
        if self._on_change is not None:
            self._on_change(record)
        return record

    def history(self) -> list[ChangeRecord]:
        """All committed change records, oldest first."""
        out = []
        for vdir in sorted(p for p in self.versions_dir.iterdir() if p.name.isdigit()):
            rec = vdir / "record.json"
            if rec.is_file():
                out.append(ChangeRecord(**json.loads(rec.read_text("utf-8"))))
        return out


def check_policy_dir(path: str | Path) -> TestReport:
    """Offline check for ``prefixgate policy test DIR``: load, compile, run
    the Rego tests. ``report.ok`` / ``report.render()`` give the verdict."""
    from policy.rego_test_runner import run_dir

    return run_dir(path)
