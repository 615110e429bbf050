"""Writing and applying one change of :class:`policy.store.PolicyStore` (split from policy/store.py, which
keeps the changes themselves; session 26, policy26): the journal and the staged files
(:class:`policy.store_disk.ChangeFiles`), the push to the target and the give-back of what was not
committed (:class:`policy.store_repair.TargetRepair`), the commit and the pruning of old versions.

Every version written here carries ``set_sha256`` in its ``record.json`` (session 26, S25-review-7): the
SHA-256 of the whole set after the change (:func:`policy.store_disk.set_digest`, the digest of its
``set.json``), checked whenever the version's stored set is read (:func:`policy.store_versions.matches_record`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path

from policy.loader import JOURNAL, PolicySet
from policy.store_disk import ChangeFiles, restore, set_digest
from policy.store_repair import TargetRepair
from policy.store_types import ChangeRecord, PolicyPersistError, PolicyTargetError, persist_error
from policy.store_versions import prune_versions, snapshot_text

__all__ = ["ChangeApplier"]

log = logging.getLogger("policy.store")


class ChangeApplier:
    """The write path of a store (a mixin of :class:`policy.store.PolicyStore`): its directories, the set
    and version in force, the target's give-backs (``_repair_target``) and ``_versions_keep``."""

    active_dir: Path
    versions_dir: Path
    version: int
    _set: PolicySet
    _repair_target: TargetRepair | None
    _versions_keep: int

    async def _persist_and_apply(self, record: ChangeRecord, new_set: PolicySet, active: dict[Path, str | None],
                                 content: str | None) -> ChangeRecord:
        """Journal and stage the files, apply ``new_set`` to the target, rename and commit
        (:class:`policy.store_disk.ChangeFiles`; S17-5: nothing in force that is not on disk). A failed
        write applies nothing; a target failure (refused, or applied and its reply lost, or the request
        cancelled: R18-1) or a failed rename or commit gives the target the committed state of the
        change's key back and rolls the disk back (only the paths this change staged, R18-4), then raises.
        The push runs in a task a cancel does not stop; the give-back runs at once, after the push's
        outcome is known, and once more after ``settle_s`` when that outcome was not a success (S19-R4,
        S19-R5: :class:`policy.store_repair.TargetRepair`).

        Returns:
            ``record`` with ``set_sha256``, the digest of ``new_set`` (written in its ``record.json``: session 26,
            S25-review-7).

        Raises:
            OSError: the version exists already or a file cannot be written (nothing applied);
                PolicyPersistError: written in part, rolled back (it says whether the target may still
                hold the change). PolicyTargetError: the target refused or did not confirm the change
                (``target_may_hold_change`` True: the store gives the target its committed set back now),
                or an earlier change's give-back on the target failed again (nothing written).
        """
        await self._repair()
        record = replace(record, set_sha256=set_digest(new_set))  # S25-review-7: the whole set is authenticated
        files = ChangeFiles(self.active_dir, self.versions_dir, record.to_dict(), self._set, active, content,
                            snapshot_text(new_set))
        fix, push = self._repair_target, None
        try:
            if fix is not None:
                push = fix.start(record, new_set)
                await (asyncio.shield(push) if fix.detached else push)  # a remote push goes on; give-back after it
        except BaseException as exc:
            if not files.roll_back():
                log.error("policy: the disk roll-back of version %d is retried before the next change", record.version)
            if fix is not None and (isinstance(exc, PolicyTargetError) or not isinstance(exc, Exception)):
                fix.give_back_soon(record, push)  # R18-1, S19-R4/R5: a lost reply or a cancel; now, in a task
                if isinstance(exc, PolicyTargetError):
                    exc.target_may_hold_change = True
                    exc.args = (f"{exc}; version {self.version} is re-applied to the target now",)
            raise
        try:
            files.commit()
        except OSError as exc:
            raise await self._roll_back(record, files, exc) from exc
        prune_versions(self.active_dir, self.versions_dir, self._versions_keep, record.version)  # never raises
        return record

    async def _roll_back(self, record: ChangeRecord, files: ChangeFiles, exc: OSError) -> PolicyPersistError:
        """R17-3: the target gets the current set back and the disk is rolled back, whatever fails."""
        fix, target_back = self._repair_target, self._repair_target is None
        try:
            if fix is not None:
                fix.hold(record)
                await fix.run()
                target_back = True
        except Exception as err:  # noqa: BLE001 - reported in the error raised, retried by _repair
            log.error("policy: re-applying version %d to the target failed (%s)", self.version,
                      err.__class__.__name__)
        except BaseException:  # cancelled during the give-back: given back in a task the cancel does not reach
            assert fix is not None
            fix.give_back_soon(record, None)
            raise
        finally:
            disk_back = files.roll_back()
        err = persist_error(record.version, self.version, exc, target_back=target_back, disk_back=disk_back)
        log.error("%s", err)
        return err

    async def _repair(self) -> None:
        """Finish the roll-back of an earlier change: the disk (an armed journal) and the target
        (:meth:`policy.store_repair.TargetRepair.run`: after the pushes in flight).

        Raises:
            OSError: the disk still cannot be restored. PolicyTargetError: the target still refuses.
        """
        if (self.active_dir / JOURNAL).exists():
            restore(self.active_dir, self.versions_dir)
        if self._repair_target is not None:
            await self._repair_target.run()

