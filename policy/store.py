"""Operator policy management: validated, versioned changes to the policy set.

``PolicyStore(active_dir, versions_dir)`` owns a policy directory in the
layout of :mod:`policy.loader` (the active set, reloaded at start) and a
version history::

    versions_dir/00000007/record.json   the ChangeRecord (JSON)
    versions_dir/00000007/content       the new module source / data JSON
                                        (absent for a delete)
    versions_dir/00000007/set.json      the whole set after the change (session 24:
                                        what :meth:`PolicyStore.rollback` puts back)

Each change: build the candidate set in memory -> check every call against
the built-in allow-list (:mod:`policy.builtins`) -> compile it and run every
Rego test (:func:`policy.rego_test_runner.run_tests`, in a worker thread)
-> refuse with :class:`PolicyRejectedError` on any failure (the active set
stays) -> arm a roll-back journal and stage the version and the active file
(:mod:`policy.store_disk`) -> apply to the target (embedded engine swap, or
remote OPA through its Policy and Data APIs) -> rename them in place and
commit (the journal removed) -> call ``on_change(record)`` (the gateway
forwards it to audit). The candidate is built under the store's lock from
the set it replaces (S17-4); a change that cannot be written is never
applied (S17-5), and one that fails at any later step is rolled back on the
target and the disk, by the store at once or by the next start after a
crash (R17-3, SF17-2: :class:`policy.store_disk.ChangeFiles`).

Remote OPA: an OPA whose paths are owned by bundles refuses Policy/Data API
writes under those roots (HTTP 4xx); the store then raises
:class:`PolicyTargetError` and records nothing. Manage such OPAs through
their bundle server instead.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from policy.builtins import check_modules
from policy.loader import PolicySet, canonical_json, check_data_path, check_module_id, load_policy_dir, sha256_text
from policy.rego_test_runner import run_tests
from policy.store_repair import TargetRepair
from policy.store_apply import ChangeApplier
from policy.store_disk import active_files, committed_versions, policy_set_document, restore, set_digest
from policy.store_types import (ChangeRecord, PolicyBaseUnsharedError, PolicyConflictError, PolicyMasterPendingError,
                                PolicyNotFoundError, PolicyPersistError, PolicyRejectedError, PolicyTarget,
                                PolicyTargetError, PolicyUnchanged, PolicyVersionError, RemoteOpaTarget,
                                check_policy_dir, shared_error)
from policy.store_reads import PolicyReads
from policy.store_versions import (DEFAULT_VERSIONS_KEEP, keep_start_snapshot, load_version, prune_versions,
                                   snapshot_text, version_entries)

__all__ = ["ChangeRecord", "PolicyBaseUnsharedError", "PolicyConflictError", "PolicyMasterPendingError",
           "PolicyNotFoundError", "PolicyPersistError", "PolicyRejectedError", "PolicyStore", "PolicyTarget",
           "PolicyTargetError", "PolicyUnchanged", "PolicyVersionError", "RemoteOpaTarget", "check_policy_dir"]

log = logging.getLogger(__name__)


class PolicyStore(ChangeApplier, PolicyReads):
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
        settle_s: seconds after a push of unknown outcome (a lost reply, a cancel) when the target is
            given the committed state of its key once more (:class:`policy.store_repair.TargetRepair`).
        versions_keep: committed versions kept in ``versions_dir`` (>= 1): the oldest beyond it are pruned
            after each commit and at start, never the version in force
            (:func:`policy.store_versions.prune_versions`; session 25).

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
        settle_s: float = 10.0,
        versions_keep: int = DEFAULT_VERSIONS_KEEP,
    ) -> None:
        self.active_dir = Path(active_dir)
        self.versions_dir = Path(versions_dir)
        self.active_dir.mkdir(parents=True, exist_ok=True)
        self.versions_dir.mkdir(parents=True, exist_ok=True)
        self._target = target
        self._on_change = on_change
        self._allowed = None if allowed_builtins is None else frozenset(allowed_builtins)
        self._lock = asyncio.Lock()
        #: changes the target may hold uncommitted, given back (R18-1, S19-R4, S19-R5); None: no target
        self._repair_target = None if target is None else TargetRepair(target, self._lock, lambda: self._set, settle_s,
                                                                       lambda: self.version)
        try:  # SF17-2: roll back a change a crash left uncommitted (the loader reads the committed set)
            rolled = restore(self.active_dir, self.versions_dir)
        except (OSError, ValueError) as exc:
            rolled = None
            log.error("policy: an uncommitted change could not be rolled back yet (%s); retried before the "
                      "next change", exc.__class__.__name__)
        if rolled is not None:
            log.error("policy: version %s was not committed before the process stopped; rolled back",
                      rolled.get("version"))
            if self._repair_target is not None:  # a remote OPA may hold it: given back by start() (S19-R10)
                self._repair_target.hold(ChangeRecord(**rolled))
        self._set = load_policy_dir(self.active_dir)
        check_modules(self._set.modules, self._allowed)
        self.version = max(committed_versions(self.active_dir, self.versions_dir), default=0)
        keep_start_snapshot(self.versions_dir, self.version, self._set)  # what a roll-back to it puts back
        self._versions_keep = versions_keep
        prune_versions(self.active_dir, self.versions_dir, versions_keep, self.version)
        self._listeners: list[Callable[[ChangeRecord], None]] = []
        self._publisher: Callable[[ChangeRecord, PolicySet], Awaitable[str]] | None = None
        self._pending_master: Callable[[], int] = lambda: 0
        #: whether the shared state stores (version, set) (None: no shared state; S27-review27-2)
        self._stored: Callable[[int, PolicySet], Awaitable[bool]] | None = None
        #: ``shared`` of the version in force when this store committed it (None: loaded or adopted)
        self._in_force_shared: str | None = None

    async def start(self) -> None:
        """Give the target back what a crash mid-change left it (S19-R10): the change whose journal this
        store's construction restored may be in force in a remote OPA; it gets the committed state of that
        key now (:meth:`policy.store_repair.TargetRepair.at_start`; a failure is logged and retried before
        the next change). Call it once the target's client is started (:meth:`gateway.pep.DecisionPoint.start`)."""
        if self._repair_target is not None:
            await self._repair_target.at_start()

    def close(self) -> None:
        """Cancel the give-backs still scheduled (call it before the target's client closes)."""
        if self._repair_target is not None:
            self._repair_target.close()

    def set_publisher(self, publish: Callable[[ChangeRecord, PolicySet], Awaitable[str]],
                      pending_master: Callable[[], int] | None = None,
                      stored: Callable[[int, PolicySet], Awaitable[bool]] | None = None) -> None:
        """Publish every change made through this store before it is answered (shared state, SF17-1):
        ``await publish(record, new set)`` under the store's lock, returning the record's ``shared``
        value; ``"conflict"`` raises :class:`PolicyConflictError`, ``"master_pending"`` (S22-review-3)
        :class:`PolicyMasterPendingError` naming ``pending_master()`` (the generation to provision), after the audit.
        ``await stored(version, set)``: whether the shared state stores that version with that set (session 27,
        S27-review27-2): a write that changes nothing here answers ``unchanged`` only then (a Redis error: not)."""
        self._publisher, self._pending_master = publish, pending_master or self._pending_master
        self._stored = stored

    def add_change_listener(self, callback: Callable[[ChangeRecord], None]) -> None:
        """Call ``callback(record)`` after every change made through this store (not after :meth:`adopt`)."""
        self._listeners.append(callback)

    @property
    def policy_set(self) -> PolicySet:
        """The active set."""
        return self._set

    # ------------------------------------------------------------ writes

    async def put_policy(self, module_id: str, source: str, who: str, *,
                         client_address: str | None = None) -> ChangeRecord | PolicyUnchanged:
        """Create or replace a module (``*_test.rego`` ids are tests). ``client_address`` (every write takes it):
        the admin request's source, put into the record after it is written (audit and answer, S22-fixsec-2).

        Raises:
            ValueError: invalid id. PolicyRejectedError: compile or test
            failure. PolicyTargetError: the target refused it. OSError: the
            version or the active file cannot be written (nothing applied);
            PolicyPersistError (an OSError): written in part, rolled back.
            PolicyConflictError: shared state stored another change at this
            version first (committed here, then replaced by the stored set).
        Returns:
            The change record; for the text in force already, :class:`PolicyUnchanged` (nothing committed,
            session 26, S25-review-8).
        """
        check_module_id(module_id)
        return await self._commit(
            lambda s: (s.with_module(module_id, source), s.modules.get(module_id), source),
            "policy", "put", module_id, who, client_address)

    async def delete_policy(self, module_id: str, who: str, *,
                            client_address: str | None = None) -> ChangeRecord | PolicyUnchanged:
        """Remove a module (refused if the rest no longer compiles or passes)."""
        check_module_id(module_id)

        def change(s: PolicySet) -> tuple[PolicySet, str | None, str | None]:
            if module_id not in s.modules:
                raise PolicyNotFoundError(module_id)
            return s.with_module(module_id, None), s.modules[module_id], None

        return await self._commit(change, "policy", "delete", module_id, who, client_address)

    async def put_data(self, path: str, value: Any, who: str, *,
                       client_address: str | None = None) -> ChangeRecord | PolicyUnchanged:
        """Create or replace the data document at ``a/b`` (a JSON object); the document in force already (the same
        canonical JSON): :class:`PolicyUnchanged`, nothing committed (session 26, S25-review-8)."""
        key = "/".join(check_data_path(path))
        if not isinstance(value, dict):
            raise ValueError("a data document must be a JSON object")
        value = copy.deepcopy(value)
        text = canonical_json(value)

        def change(s: PolicySet) -> tuple[PolicySet, str | None, str | None]:
            old = s.data_docs.get(key)
            return s.with_data(key, value), None if old is None else canonical_json(old), text

        return await self._commit(change, "data", "put", key, who, client_address)

    async def delete_data(self, path: str, who: str, *,
                          client_address: str | None = None) -> ChangeRecord | PolicyUnchanged:
        """Remove the data document at ``a/b``."""
        key = "/".join(check_data_path(path))

        def change(s: PolicySet) -> tuple[PolicySet, str | None, str | None]:
            if key not in s.data_docs:
                raise PolicyNotFoundError(path)
            return s.with_data(key, None), canonical_json(s.data_docs[key]), None

        return await self._commit(change, "data", "delete", key, who, client_address)

    async def _commit(
        self,
        change: Callable[[PolicySet], tuple[PolicySet, str | None, str | None]],
        kind: Literal["policy", "data"],
        op: Literal["put", "delete"],
        target: str,
        who: str,
        client_address: str | None = None,
    ) -> ChangeRecord | PolicyUnchanged:
        """One change: ``change(current set) -> (new set, old text, new text)``, run under the lock
        (S17-4: the candidate is built on the set it replaces); tests off the loop (S17-7). A put of the text
        already in force (``old text == new text``) commits nothing: :class:`PolicyUnchanged` (S25-review-8)."""
        if not who:
            raise ValueError("a change needs an operator id")
        async with self._lock:
            self._check_base()
            new_set, old_text, new_text = change(self._set)
            if old_text == new_text and await self._settled():
                return self._unchanged(f"{kind} {op} {target!r}", client_address)
            await self._gate(new_set, f"{kind} {op} {target!r} refused")
            record = ChangeRecord(version=self.version + 1, who=who, kind=kind, op=op, target=target,
                                  old_sha256=sha256_text(old_text), new_sha256=sha256_text(new_text), time=time.time())
            path = self.active_dir / target if kind == "policy" else self.active_dir / "data" / f"{target}.json"
            record = await self._apply(record, new_set, {path: new_text}, new_text, client_address)
        if (err := shared_error(record, self._pending_master())) is not None:
            raise err
        return record

    async def rollback(self, to_version: Any, who: str, *,
                       client_address: str | None = None) -> ChangeRecord | PolicyUnchanged:
        """Put the whole set of committed version ``to_version`` back, as the NEW version ``version + 1``
        (session 24, S23-newcomer-3; :mod:`policy.store_versions`): the stored set is checked against its
        change record, then it goes through the gate, the disk, the target, the publisher (the same 409
        race) and the audit of any change. Its record: ``kind`` ``set``, ``target`` ``*``, ``op`` ``put``, ``old_sha256`` /
        ``new_sha256`` the digests of the whole sets, ``rollback_to`` ``to_version``. ``to_version`` may be the
        version in force when the active set differs from its stored set (the directory was edited outside the
        admin API: session 25, S25-newcomer-8); it is then committed as ``version + 1`` like any roll-back.
        Session 26 (S25-review-8): when the stored set (checked) is the set in force, nothing is committed and
        :class:`PolicyUnchanged` is returned (concurrent roll-backs to one version make one version; before,
        each made a version, and ``to_version`` = the version in force without drift was a 400).

        Raises:
            PolicyVersionError: 400/404/409 (:func:`policy.store_versions.load_version`), 501 when the
            target cannot take a whole set (a remote OPA); nothing changed. Otherwise as :meth:`put_policy`.
        """
        if not who:
            raise ValueError("a change needs an operator id")
        if self._target is not None and not getattr(self._target, "applies_whole_sets", False):
            raise PolicyVersionError("roll-back needs the embedded engine: a remote OPA takes one module or "
                                     "document per request (roll back through its bundle server, or put the "
                                     "earlier texts back one by one)", 501, "not_supported")
        async with self._lock:
            self._check_base()
            old_set = load_version(self.active_dir, self.versions_dir, to_version, self.version, self._set)
            if set_digest(old_set) == set_digest(self._set) and await self._settled():
                return self._unchanged(f"roll-back to version {to_version}", client_address)
            await self._gate(old_set, f"roll-back to version {to_version} refused")
            record = ChangeRecord(version=self.version + 1, who=who, kind="set", op="put", target="*",
                                  old_sha256=set_digest(self._set), new_sha256=set_digest(old_set), time=time.time(),
                                  rollback_to=to_version)
            record = await self._apply(record, old_set, active_files(self.active_dir, old_set),
                                       snapshot_text(old_set), client_address)
        if (err := shared_error(record, self._pending_master())) is not None:
            raise err
        return record

    def _check_base(self) -> None:
        """Refuse a change while the set in force here is not the shared one and its replacement is on its way
        (session 27, S27-review27-6): with shared state (``stored`` given to :meth:`set_publisher`), after a change
        answered ``conflict`` or ``unresolved`` and before :meth:`adopt` takes the stored set. Such a change was
        built on the losing set, numbered above the stored version and stored: another instance's published change
        was gone everywhere and the change answered 409 was in force. Raises :class:`PolicyBaseUnsharedError`."""
        shared = self._in_force_shared
        if self._stored is None or shared not in ("conflict", "unresolved"):
            return
        if shared == "conflict":
            raise PolicyBaseUnsharedError(
                f"policy version {self.version} in force here lost a race to another instance's change, whose set "
                "is being adopted here: no change is made on top of it; retry", 409, "conflict")
        raise PolicyBaseUnsharedError(
            f"policy version {self.version} in force here was not stored in shared state, and shared state has not "
            "answered since: no change is made on top of it; check the policy in force, then retry", 503,
            "state_unavailable")

    async def _settled(self) -> bool:
        """Whether a write that changes nothing may answer ``unchanged``: the target's pending give-backs are
        made first (raising as before a change: PolicyTargetError, OSError; the target may differ from the
        set in force until then), and the version in force must not be one shared state left unshared
        (``conflict``: its adoption may still be on its way, ``master_pending``, ``unresolved``): such a write
        is made as a change again, published and answered as before. With shared state, the version and set in
        force here must also be the ones it stores (session 27, S27-review27-2: another instance's change stored and
        not yet adopted here made a write of the local set answer 200 ``unchanged``, then the adoption undid it;
        made as a change it answers 409 ``conflict`` as before session 26). One read of the shared state; an error
        there: made as a change (its publish answers as any change's)."""
        await self._repair()
        if self._in_force_shared in ("conflict", "master_pending", "unresolved"):
            return False
        if self._stored is None:
            return True
        try:
            return await self._stored(self.version, self._set)
        except Exception as exc:  # noqa: BLE001 - the write is then made as a change, its publish answers
            log.warning("policy: the shared state's version could not be read (%s): the write is made as a change",
                        exc.__class__.__name__)
            return False

    def _unchanged(self, what: str, client_address: str | None) -> PolicyUnchanged:
        """The answer of a write that changes nothing (session 26, S25-review-8): the version in force and its
        listing entry; logged at INFO (digests and ids only), not audited (no change)."""
        listed = version_entries(self.active_dir, self.versions_dir, limit=1, before=self.version + 1)
        entry = listed[0] if listed and listed[0]["version"] == self.version else {"version": self.version}
        log.info("policy: %s changes nothing: version %d stays in force", what, self.version)
        return PolicyUnchanged(self.version, entry, client_address)

    async def _gate(self, new_set: PolicySet, refused: str) -> None:
        """The allow-list, the compile and every Rego test, off the loop (S17-7). Raises PolicyRejectedError."""
        report = await asyncio.to_thread(run_tests, new_set, self._allowed)
        if not report.ok:
            raise PolicyRejectedError(refused, report)

    async def _apply(self, record: ChangeRecord, new_set: PolicySet, active: dict[Path, str | None],
                     content: str | None, client_address: str | None) -> ChangeRecord:
        """Under the lock: write, apply and commit ``record`` (:meth:`_persist_and_apply`), then publish it
        and hand it to audit; returns the record as answered (``client_address``, ``shared``)."""
        record = await self._persist_and_apply(record, new_set, active, content)
        self._set, self.version = new_set, record.version
        record = replace(record, client_address=client_address)  # written without it (record.json as before)
        try:  # SF17-1: published inside the request, before the answer and the audit
            if self._publisher is not None:
                record = replace(record, shared="unpublished")
                record = replace(record, shared=await self._publisher(record, new_set))
        finally:  # a committed change is always handed to audit, even if the request is cancelled
            self._in_force_shared = record.shared
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
        :class:`PolicyRejectedError`, nothing changes), staged on disk as the
        active set and as version ``version`` (``kind="set"``, ``op="put"``, ``target="*"``),
        applied to the target, renamed in place and committed (as a local
        change: :class:`policy.store_disk.ChangeFiles`, rolled back on any
        failure), and handed to ``on_change`` (audit); the change listeners
        and the publisher are not called (it is not re-published).

        Raises:
            PolicyRejectedError, PolicyTargetError, OSError: nothing adopted.
        """
        async with self._lock:
            if version <= self.version:
                return None
            await self._gate(policy_set, f"shared policy version {version} refused")
            record = ChangeRecord(version=version, who=who, kind="set", op="put", target="*",
                                  old_sha256=set_digest(self._set), new_sha256=set_digest(policy_set),
                                  time=time.time())
            record = await self._persist_and_apply(record, policy_set, active_files(self.active_dir, policy_set),
                                                   canonical_json(policy_set_document(policy_set)))
            self._set, self.version, self._in_force_shared = policy_set, version, None
        if self._on_change is not None:
            self._on_change(record)
        return record
