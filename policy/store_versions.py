"""The stored versions of a policy set: what a roll-back puts back, and the listing (session 24, S23-newcomer-3).

Every version a :class:`policy.store.PolicyStore` commits from session 24 on holds, besides its
``record.json`` and ``content``, the WHOLE set after its change (``versions_dir/<N>/set.json``, canonical
JSON of :func:`policy.loader.policy_set_document`), written in the same staged directory and renamed in
place with it (:class:`policy.store_disk.ChangeFiles`). That is OPA's bundle model (a bundle is a complete
snapshot of policy and data with a ``revision``; activating one replaces the whole set, and going back is
serving an earlier bundle) and Envoy xDS's state of the world (each response holds every resource with
its ``version_info``; versions only move forward): a roll-back to N is a NEW version whose set is N's,
checked, applied, recorded and published like any change, never a rewind of the history.

At start the store keeps the set it loaded as the snapshot of the version in force when that version
has none (:func:`keep_start_snapshot`): on a fresh store that is version 0, ``versions_dir/00000000/set.json``
(the set loaded at the first start; no ``record.json``: it is not a change); after an upgrade, the
latest version committed before session 24 (only when the loaded set agrees with its change record).
Earlier versions of such a history hold no set and cannot be rolled back to (409
``version_not_restorable``). A snapshot is never rewritten: when the loaded set differs from the
snapshot of the version in force (the directory was edited outside the admin API), a WARNING says so.

Session 26 (policy26, S25-review-7): the ``record.json`` of every version committed since carries ``set_sha256``,
the SHA-256 of its whole stored set; a stored set is checked against it whenever it is read (a roll-back, the
start), so a ``set.json`` edited on disk is refused (409 ``version_not_restorable``), not put back. Older
records keep the check of their changed key only; at start, the set loaded is stored for such a version only
when it also equals the previous version's stored set in every other key (when that one is stored).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from audit.atomic_file import write_atomic
from policy.loader import PolicySet, canonical_json, policy_set_document, policy_set_from_document, sha256_text
from policy.store_disk import _STAGED, SNAPSHOT, committed_versions, set_digest
from policy.store_types import PolicyVersionError

__all__ = ["DEFAULT_VERSIONS_KEEP", "MAX_LISTED", "drift_state", "keep_start_snapshot", "load_version", "matches_record",
           "prune_versions", "snapshot_text", "version_entries"]

log = logging.getLogger(__name__)

#: committed versions kept on disk by default (``policy.versions_keep``; session 25, S24-fixreg-3)
DEFAULT_VERSIONS_KEEP = 100
#: the most versions one listing answers (each entry reads its set's file for the digest)
MAX_LISTED = 100


def snapshot_text(policy_set: PolicySet) -> str:
    """The ``set.json`` text of ``policy_set`` (its SHA-256 is :func:`policy.store_disk.set_digest`)."""
    return canonical_json(policy_set_document(policy_set))


def matches_record(record: Mapping[str, Any], policy_set: PolicySet) -> bool:
    """Whether ``policy_set`` is the set after ``record``'s change, as far as the record tells: the
    changed module or data document has the record's ``new_sha256`` (absent for a delete); a whole-set
    change (``target`` ``*``: adopted or rolled back) has it as the set's digest; and since session 26
    (S25-review-7) the whole set has the record's ``set_sha256`` when the record has one (older records:
    the changed key only)."""
    target, new = record.get("target"), record.get("new_sha256")
    whole = record.get("set_sha256")
    if whole is not None and set_digest(policy_set) != whole:
        return False
    if target == "*":
        return set_digest(policy_set) == new
    if record.get("kind") == "policy":
        return sha256_text(policy_set.modules.get(str(target))) == new
    value = policy_set.data_docs.get(str(target))
    return sha256_text(None if value is None else canonical_json(value)) == new


def _vdir(versions_dir: Path, version: int) -> Path:
    return versions_dir / f"{version:08d}"


def _record(versions_dir: Path, version: int) -> dict[str, Any] | None:
    """``record.json`` of ``version`` (None: none, version 0's start snapshot). Raises OSError, ValueError."""
    path = _vdir(versions_dir, version) / "record.json"
    if version == 0 and not path.exists():
        return None
    doc = json.loads(path.read_text("utf-8"))
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not a JSON object")
    return doc


def _snapshot_path(versions_dir: Path, version: int, record: Mapping[str, Any] | None) -> Path | None:
    """The file holding ``version``'s whole set: ``set.json``, or the ``content`` of a whole-set version
    committed before session 24 (adopted from another instance); None when there is none."""
    vdir = _vdir(versions_dir, version)
    if (vdir / SNAPSHOT).is_file():
        return vdir / SNAPSHOT
    if record is not None and record.get("target") == "*" and (vdir / "content").is_file():
        return vdir / "content"
    return None


def load_version(active_dir: Path, versions_dir: Path, version: Any, current: int,
                 active: PolicySet | None = None) -> PolicySet:
    """The whole set of committed ``version``, checked against its change record (fail closed).

    Args:
        version: the requested version (an int from 0 to ``current``; ``current`` itself only with
            ``active``; a bool is not an int here).
        current: the version in force.
        active: the set in force (session 25, S25-newcomer-8): when the policy directory was edited outside
            the admin API between two starts, it differs from ``current``'s stored set, and ``current``
            itself may be put back (the drift of :func:`drift_state`). Whether the set returned is the set in
            force (nothing to change) is the caller's to tell (session 26, S25-review-8: the store answers
            ``unchanged``; before, ``current`` without drift was a 400 here).

    Raises:
        PolicyVersionError: 400 ``invalid_parameter`` (not an int, negative, a later version, or ``current``
            without ``active``), 404 ``resource_not_found`` (no such committed version), 409
            ``version_not_restorable`` (no stored set, an unreadable one, or one that does not match the
            record: its changed key, and its whole set's ``set_sha256`` when recorded, S25-review-7; logged).
    """
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise PolicyVersionError("'to' must be a version number (an integer >= 0)", 400, "invalid_parameter")
    if version > current or (version == current and active is None):
        raise PolicyVersionError(f"version {version} is not earlier than the version in force ({current})", 400,
                                 "invalid_parameter")
    committed = committed_versions(active_dir, versions_dir)
    if version not in committed:
        if committed and version < min(committed):  # session 25: pruned (policy.versions_keep)
            raise PolicyVersionError(f"policy version {version} is no longer stored: older than the oldest version "
                                     f"kept ({min(committed)}; policy.versions_keep)", 404, "version_pruned")
        raise PolicyVersionError(f"no policy version {version}", 404, "resource_not_found")
    try:
        record = _record(versions_dir, version)
        path = _snapshot_path(versions_dir, version, record)
        if path is None:
            raise PolicyVersionError(f"policy version {version} holds no stored set (committed before session 24, "
                                     "or version 0 of a store first started before it)", 409, "version_not_restorable")
        policy_set = policy_set_from_document(json.loads(path.read_text("utf-8")))
    except (OSError, ValueError) as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise PolicyVersionError(f"policy version {version}: its stored set cannot be read ({exc.__class__.__name__})",
                                 409, "version_not_restorable") from None
    if record is not None and not matches_record(record, policy_set):
        log.error("policy: the stored set of version %d (sha256 %s) does not match its change record (target %r, "
                  "set_sha256 %s): refused; %s was changed outside the gateway", version, set_digest(policy_set),
                  record.get("target"), record.get("set_sha256"), path)
        raise PolicyVersionError(f"policy version {version}: its stored set does not match its change record "
                                 f"(target {record.get('target')!r})", 409, "version_not_restorable")
    return policy_set


def drift_state(versions_dir: Path, current: int, active: PolicySet) -> dict[str, Any]:
    """Whether the set in force is the committed set of the version in force (session 25, S25-newcomer-8).

    Returns:
        ``{"active_set_sha256": SHA-256 of ``active`` (:func:`policy.store_disk.set_digest`),
        "in_force_set_sha256": SHA-256 of ``current``'s stored set (None: none stored, or unreadable),
        "drift": True when both are known and differ (the policy directory was edited outside the admin API:
        a roll-back to ``current`` puts its committed set back), None when ``current`` has no stored set,
        else False}``. Never raises.
    """
    active_sha = set_digest(active)
    try:
        path = _snapshot_path(versions_dir, current, _record(versions_dir, current))
        stored = None if path is None else hashlib.sha256(path.read_bytes()).hexdigest()
    except (OSError, ValueError):
        stored = None
    return {"active_set_sha256": active_sha, "in_force_set_sha256": stored,
            "drift": None if stored is None else stored != active_sha}


def keep_start_snapshot(versions_dir: Path, version: int, loaded: PolicySet) -> str:
    """At start, make the set loaded restorable as ``version`` (the version in force) when that version has
    no stored set (module docstring). Never raises: a failure is logged (roll-backs to it are then refused).

    Returns:
        ``"present"`` (stored and equal to the loaded set), ``"differs"`` (stored and different: logged,
        kept), ``"written"``, ``"mismatch"`` (not written: the loaded set does not match the version's change
        record, logged) or ``"failed"`` (could not be read or written, logged).
    """
    try:
        record = _record(versions_dir, version)
        path = _snapshot_path(versions_dir, version, record)
        text = snapshot_text(loaded)
        if path is not None:
            stored = hashlib.sha256(path.read_bytes()).hexdigest()
            if stored == sha256_text(text):
                return "present"
            log.warning("policy: the active set (sha256 %s) differs from version %d as committed (%s): the policy "
                        "directory was changed outside the admin API; a roll-back to version %d puts the committed "
                        "set back", sha256_text(text), version, stored, version)
            return "differs"
        if record is not None and not matches_record(record, loaded):
            log.warning("policy: the active set does not match version %d's change record: not stored as that "
                        "version's set (a roll-back to it is refused)", version)
            return "mismatch"
        if record is not None and not _agrees_with_previous(versions_dir, version, record, loaded):
            log.warning("policy: the active set differs from version %d's stored set in a key other than version "
                        "%d's change (%r), or that set cannot be read: not stored as version %d's set (a roll-back "
                        "to it is refused)", version - 1, version, record.get("target"), version)
            return "mismatch"
        _vdir(versions_dir, version).mkdir(exist_ok=True)
        write_atomic(_vdir(versions_dir, version) / SNAPSHOT, text.encode("utf-8"))
        return "written"
    except (OSError, ValueError) as exc:
        log.error("policy: the set of version %d could not be stored for roll-backs (%s)", version,
                  exc.__class__.__name__)
        return "failed"


def _agrees_with_previous(versions_dir: Path, version: int, record: Mapping[str, Any], loaded: PolicySet) -> bool:
    """Whether ``loaded`` equals the stored set of ``version - 1`` in every key but the one ``record`` changed
    (session 26, S25-review-7): True when ``record`` authenticates the whole set itself (``set_sha256``, or a
    whole-set change) or ``version - 1`` has no stored set (a history written before session 24, or pruned:
    the changed key's check stays the only one); False when that set differs elsewhere, cannot be read, or
    does not match its own record (fail closed). Raises OSError, ValueError (a record unreadable)."""
    if record.get("set_sha256") is not None or record.get("target") == "*" or version < 1:
        return True
    previous = _record(versions_dir, version - 1) if _vdir(versions_dir, version - 1).is_dir() else None
    path = _snapshot_path(versions_dir, version - 1, previous)
    if path is None:
        return True
    try:
        before = policy_set_from_document(json.loads(path.read_text("utf-8")))
    except (OSError, ValueError):
        return False
    if previous is not None and not matches_record(previous, before):
        return False
    target = str(record.get("target"))

    def others(s: PolicySet) -> str | None:  # the set without the changed key, canonical (1 is not true)
        return set_digest(s.with_module(target, None) if record.get("kind") == "policy" else s.with_data(target, None))

    return others(before) == others(loaded)


def version_entries(active_dir: Path, versions_dir: Path, *, limit: int, before: int | None) -> list[dict[str, Any]]:
    """The committed versions, newest first: at most ``limit`` (1..:data:`MAX_LISTED`) below ``before``.

    Each entry is the version's change record (``version``, ``who``, ``time`` (Unix seconds), ``kind``,
    ``op``, ``target``, ``old_sha256``, ``new_sha256``, ``rollback_to`` for a roll-back; digests and ids,
    never policy text) plus ``set_sha256`` (SHA-256 of its stored set's file, None without one) and ``restorable``
    (a stored set, and since session 26 one whose file digest is the record's ``set_sha256`` when it has one).
    Version 0 (the start set, no record) is ``{"version": 0, "start": true, "set_sha256", "restorable"}``.

    Raises:
        ValueError: ``limit`` outside 1..MAX_LISTED. OSError: the directory cannot be read.
    """
    if not 1 <= limit <= MAX_LISTED:
        raise ValueError(f"limit must be 1..{MAX_LISTED}")
    versions = sorted((v for v in committed_versions(active_dir, versions_dir) if before is None or v < before),
                      reverse=True)[:limit]
    out = []
    for version in versions:
        try:
            record = _record(versions_dir, version)
        except (OSError, ValueError):
            out.append({"version": version, "unreadable": True, "set_sha256": None, "restorable": False})
            continue
        entry: dict[str, Any] = {"version": 0, "start": True} if record is None else dict(record)
        path = _snapshot_path(versions_dir, version, record)
        try:
            entry["set_sha256"] = None if path is None else hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            entry["set_sha256"] = None
        recorded = None if record is None else record.get("set_sha256")  # S25-review-7: a set.json edited on disk
        entry["restorable"] = entry["set_sha256"] is not None and recorded in (None, entry["set_sha256"])
        out.append(entry)
    return out


def prune_versions(active_dir: Path, versions_dir: Path, keep: int, in_force: int) -> list[int]:
    """Remove the oldest committed versions beyond the newest ``keep`` (``policy.versions_keep``, >= 1;
    session 25, S24-fixreg-3), never ``in_force`` (the version in force) nor an uncommitted one. Called after
    each committed change and at start. Each version directory is first renamed to a staged name (one atomic
    ``rename(2)``: a version is there whole or gone, never half-removed), then deleted; what a crash leaves
    under the staged name is removed by the next start (:func:`policy.store_disk.restore`). A roll-back to a
    pruned version answers 404 ``version_pruned`` (:func:`load_version`). A failure on the disk is logged, not
    raised (the change stays committed), and the next commit tries again.

    Returns:
        the versions removed, oldest first.

    Raises:
        ValueError: ``keep`` < 1 (the configuration refuses it).
    """
    if keep < 1:
        raise ValueError("keep must be >= 1")
    try:
        versions = sorted(committed_versions(active_dir, versions_dir))
    except OSError as exc:
        log.error("policy: the versions directory cannot be listed to prune it (%s)", exc.__class__.__name__)
        return []
    removed: list[int] = []
    for version in versions[:max(0, len(versions) - keep)]:
        if version == in_force:
            continue
        gone = versions_dir / f"{_STAGED}pruned-{version:08d}-{secrets.token_hex(4)}"
        try:
            os.rename(_vdir(versions_dir, version), gone)
        except OSError as exc:
            log.error("policy: version %d could not be pruned (%s); retried after the next change", version,
                      exc.__class__.__name__)
            break
        shutil.rmtree(gone, ignore_errors=True)
        removed.append(version)
    if removed:
        log.info("policy: pruned versions %d..%d (policy.versions_keep %d)", removed[0], removed[-1], keep)
    return removed
