"""The types of :mod:`policy.store`: change records, its errors, and the targets it applies changes to.

Imported through :mod:`policy.store` (which re-exports every name here).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from opa_client import AsyncOpaClient
from opa_client.errors import DeleteDataError, DeletePolicyError

from policy.decision import PolicyError
from policy.loader import PolicySet, is_test_module
from policy.rego_test_runner import TestReport

__all__ = ["ChangeRecord", "PolicyBaseUnsharedError", "PolicyConflictError", "PolicyMasterPendingError",
           "PolicyNotFoundError", "PolicyRejectedError", "PolicySharedStateError", "PolicyTarget",
           "PolicyPersistError", "PolicyTargetError", "PolicyUnchanged", "PolicyVersionError", "RemoteOpaTarget",
           "check_policy_dir", "persist_error", "shared_error"]


@dataclass(frozen=True)
class ChangeRecord:
    """One accepted change: ``who`` (operator id), ``kind`` policy|data|set
    (``set``: a whole-set version, ``target`` ``*``: a roll-back or a set adopted from another instance, since
    session 25, S25-newcomer-7; such versions committed before it say ``policy``),
    ``op`` put|delete, ``target`` (policy id or data path), SHA-256 hex
    digests of the old and new content (None when absent), ``version``
    (monotonic), ``time`` (seconds since the epoch). ``shared`` (shared state, issue 16; in the
    audit record and the admin answer, not in ``record.json``): what publishing it inside the change
    gave, ``published``, ``conflict`` (another instance stored this version first; this change is
    replaced by that one and the admin request answers 409, SF17-1), ``master_pending`` (not stored: a
    higher master generation is pending here and the stored record cannot be authenticated; the change is
    in force on this instance only and the request answers 503, S22-review-3), ``unresolved`` (not stored, and
    Redis failed before the stored record could be read: which of the two is unknown, the request answers 503
    ``state_unavailable``, S22-fixrot-2) or ``unpublished`` (Redis did not answer the publish; the next sync
    publishes it); None without shared state and for an adopted set. ``client_address``: the admin
    request's source (the peer, or the client a trusted proxy attests; session 23, S22-fixsec-2), in the
    audit record and the admin answer; None for a change made without a request and for an adopted set, and
    then left out of :meth:`to_dict` (``record.json`` is written before it is set: its format is unchanged).
    ``rollback_to``: for a roll-back (:meth:`policy.store.PolicyStore.rollback`, session 24, S23-newcomer-3), the
    earlier version whose whole set this version puts back (``target`` ``*``, ``op`` ``put``); None otherwise and
    then left out of :meth:`to_dict` (every other ``record.json`` keeps its format). ``set_sha256`` (session 26,
    S25-review-7): the SHA-256 of the whole set after the change (:func:`policy.store_disk.set_digest`, the digest
    of the version's ``set.json``), in the ``record.json`` of every version committed since, checked whenever its
    stored set is read (a roll-back to it, the start); None (left out of :meth:`to_dict`) in older records."""

    version: int
    who: str
    kind: Literal["policy", "data", "set"]
    op: Literal["put", "delete"]
    target: str
    old_sha256: str | None
    new_sha256: str | None
    time: float
    shared: str | None = None
    client_address: str | None = None
    rollback_to: int | None = None
    set_sha256: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible form (for audit and the admin API); ``client_address``, ``rollback_to`` and ``set_sha256``
        only when set."""
        out = asdict(self)
        for optional in ("client_address", "rollback_to", "set_sha256"):
            if out[optional] is None:
                del out[optional]
        return out

    def audit_form(self) -> dict[str, Any]:
        """The operator audit record of this change (``record_operator``): ``action`` ``policy_change``, every
        field of :meth:`to_dict`, and ``actor`` (= ``who``, the operator's SPIFFE ID) and ``ts`` (= ``time``, Unix
        seconds), the names tenancy's operator records use (session 25, S25-newcomer-4: one SIEM rule on
        ``operator.actor`` / ``operator.ts`` for every operator event; ``who`` and ``time`` stay for compatibility)."""
        return {"action": "policy_change", **self.to_dict(), "actor": self.who, "ts": self.time}


@dataclass(frozen=True)
class PolicyUnchanged:
    """The answer of a write that would change nothing (session 26, S25-review-8): a ``PUT`` of the text or
    document already in force, or a roll-back to a version whose stored set is the set in force (five
    concurrent ``{"to": 3}`` made one version, not five). No version is committed, nothing is applied,
    published or handed to ``on_change`` (there is no change to audit). ``version``: the version in force;
    ``entry``: its listing entry (:func:`policy.store_versions.version_entries`: its change record with
    ``set_sha256`` and ``restorable``; version 0: ``{"version": 0, "start": true, ...}``); ``client_address``:
    the request's source. The admin answers 200 ``{"result": entry, "unchanged": true}``."""

    version: int
    entry: dict[str, Any]
    client_address: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``result`` of the admin answer: a copy of ``entry``."""
        return dict(self.entry)


class PolicyRejectedError(PolicyError):
    """A change was refused: it does not compile or a Rego test fails.

    ``report`` is the test report (compile ``errors`` or failing tests).
    """

    def __init__(self, message: str, report: TestReport) -> None:
        super().__init__(message)
        self.report = report


class PolicyVersionError(PolicyError):
    """A roll-back that cannot be made (session 24, S23-newcomer-3); nothing changed. ``status`` and ``code``
    are the admin answer's: 404 ``resource_not_found`` (no such version) or ``version_pruned`` (older than the
    versions kept, ``policy.versions_keep``: session 25), 409 ``version_not_restorable`` (the
    version holds no stored set, e.g. committed before session 24, or its stored set does not match its change
    record), 400 ``invalid_parameter`` (the version in force or a later one), 501 ``not_supported`` (a target
    that cannot take a whole set: a remote OPA)."""

    def __init__(self, message: str, status: int, code: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


class PolicyTargetError(PolicyError):
    """The decision point refused or failed to apply a validated change.

    ``target_may_hold_change``: True when raised by a change (R18-1): the target may have applied it before
    failing (a remote OPA whose reply was lost); the store gives it the committed set back at once, after the
    push's outcome (S19-R5, :class:`policy.store_repair.TargetRepair`), and before its next
    change. False for a refused roll-back of an earlier change.
    """

    target_may_hold_change: bool = False


class PolicyConflictError(PolicyError):
    """Another gateway instance stored the same policy version first (SF17-1): this instance's change
    is replaced by the stored one (adopted as the next version); the operator retries. ``record``: the
    change (``shared="conflict"``), also handed to audit."""

    def __init__(self, message: str, record: ChangeRecord) -> None:
        super().__init__(message)
        self.record = record


class PolicyMasterPendingError(PolicyError):
    """A change committed and in force on this instance that shared state did not store (S22-review-3): a
    higher master generation (``generation``) is announced that this instance's secret source cannot give
    yet, and the stored record is not authenticated here (it may be the new master's), so it can be neither
    replaced nor adopted. This instance decides under the change until ``generation`` is provisioned here;
    then it adopts the stored set (the change is then gone here too: the operator makes it again).
    ``record``: the change (``shared="master_pending"``), also handed to audit."""

    def __init__(self, message: str, record: ChangeRecord, generation: int) -> None:
        super().__init__(message)
        self.record = record
        self.generation = generation


class PolicyBaseUnsharedError(PolicyError):
    """A change refused before it is built, nothing committed (session 27, S27-review27-6): the set in force on
    this instance lost a race in shared state (its last change answered ``conflict``, or ``unresolved``) and the
    stored set is not adopted here yet. A change built on it was numbered above the stored version, stored, and
    replaced another instance's published change on every instance. ``status`` / ``code``: 409 ``conflict``
    (retry once the stored set is adopted: at once, or at the next poll) or 503 ``state_unavailable``
    (``unresolved``: shared state has not answered since)."""

    def __init__(self, message: str, status: int, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class PolicySharedStateError(PolicyError):
    """A change committed and in force on this instance that shared state refused to store, after which Redis
    failed before the stored record could be read (S22-fixrot-2): whether the stored set replaces the change
    here (a conflict, adopted by the next sync) or cannot be read (a master pending) is unknown; the admin
    answers 503 ``state_unavailable`` (fail closed). ``record``: the change (``shared="unresolved"``)."""

    def __init__(self, message: str, record: ChangeRecord) -> None:
        super().__init__(message)
        self.record = record


def shared_error(record: ChangeRecord, pending_generation: int) -> PolicyError | None:
    """The error a committed change answers for its ``record.shared`` (None: answered as made):
    :class:`PolicyConflictError` for ``conflict`` (SF17-1), :class:`PolicyMasterPendingError` for
    ``master_pending`` (``pending_generation``: the master generation to provision here, S22-review-3),
    :class:`PolicySharedStateError` for ``unresolved`` (S22-fixrot-2)."""
    if record.shared == "conflict":
        return PolicyConflictError(f"policy version {record.version} was stored by another instance first; "
                                   "its set is adopted here: retry the change", record)
    if record.shared == "master_pending":
        return PolicyMasterPendingError(
            f"policy version {record.version} is applied on this instance only and not shared: master generation "
            f"{pending_generation} is announced and not provisioned here, so the stored set cannot be read; "
            f"provision master generation {pending_generation} on this instance (it then adopts the stored set "
            "and this change is gone: make it again)", record, pending_generation)
    if record.shared == "unresolved":
        return PolicySharedStateError(
            f"policy version {record.version} is applied on this instance and was not stored (another instance "
            "stored this version or a higher one first), and shared state failed before the stored set could be "
            "read: whether it replaces this change here is decided when shared state answers again; check the "
            "policy in force, then retry", record)
    return None


class PolicyPersistError(OSError):
    """A validated change that could not be written and was rolled back (R17-3).

    ``target_may_hold_change``: True when giving the target its previous set back failed too (a remote
    OPA may still decide with the change; the store re-applies the previous set before its next change).
    ``disk_restored``: False when the active directory or the versions directory could not be put back;
    the journal then stays, so the loader reads the committed set, and the next change or a restart
    finishes the roll-back.
    """

    def __init__(self, message: str, *, target_may_hold_change: bool, disk_restored: bool) -> None:
        super().__init__(message)
        self.target_may_hold_change = target_may_hold_change
        self.disk_restored = disk_restored


def persist_error(version: int, current: int, exc: OSError, *, target_back: bool,
                  disk_back: bool) -> PolicyPersistError:
    """The error of change ``version`` that could not be written (``exc``) and was rolled back to
    ``current``: whether the target decides with ``current`` again and whether the disk is back."""
    msg = (f"policy version {version} could not be written ({exc.__class__.__name__}: {exc.strerror or exc}); "
           + (f"the target decides with version {current} again" if target_back else
              f"the target may still hold version {version} (version {current} is re-applied before the next "
              "change)")
           + ("" if disk_back else f"; the disk roll-back is finished before the next change or at the next "
              f"start (version {current} is what a restart loads)"))
    return PolicyPersistError(msg, target_may_hold_change=not target_back, disk_restored=disk_back)


class PolicyNotFoundError(PolicyError, KeyError):
    """No policy module or data document with that id/path."""


class PolicyTarget(Protocol):
    """Where accepted changes are applied (EmbeddedOpa implements it). A target may set a class attribute
    ``applies_after_cancel`` (read with ``getattr``, default True): False when a cancelled ``apply`` has
    certainly applied nothing (the embedded engine swaps only after its build returns), so the store
    cancels it with its request; True (a remote server goes on with a request its client gave up on)
    and the store lets it finish and gives its key back after it (S19-R4). ``applies_whole_sets`` (default
    False): True when ``apply`` of a ``*`` change (a whole set: a roll-back) puts exactly that set in force;
    the store refuses a roll-back to a target without it (session 24)."""

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

    #: OPA goes on with a request whose client went away (S19-R4, :class:`PolicyTarget`)
    applies_after_cancel = True
    #: the Policy and Data APIs take one key per request: no whole set (a roll-back) is pushed (:class:`PolicyTarget`)
    applies_whole_sets = False

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
        except (DeletePolicyError, DeleteDataError) as exc:
            if exc.expression != _NOT_FOUND:  # R18-1: deleting what OPA does not hold is done (idempotent undo)
                raise PolicyTargetError(f"remote OPA refused the change: {type(exc).__name__}") from None
        except Exception as exc:  # the client raises many unrelated types
            raise PolicyTargetError(f"remote OPA refused the change: {type(exc).__name__}") from None
        if self._on_applied is not None:
            self._on_applied()


#: OPA's error code for a 404 (https://www.openpolicyagent.org/docs/latest/rest-api/#errors)
_NOT_FOUND = "resource_not_found"


def check_policy_dir(path: str | Path) -> TestReport:
    """Offline check for ``prefixgate policy test DIR``: load, compile, run
    the Rego tests. ``report.ok`` / ``report.render()`` give the verdict."""
    from policy.rego_test_runner import run_dir

    return run_dir(path)
