"""The reads of :class:`policy.store.PolicyStore`: the active set's modules and documents, the history and the
stored versions (split from policy/store.py, which keeps the writes; session 24)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from policy.loader import PolicySet, canonical_json, check_data_path, is_test_module, sha256_text
from policy.store_disk import committed_records
from policy.store_types import ChangeRecord, PolicyNotFoundError
from policy.store_versions import drift_state, version_entries

__all__ = ["PolicyReads"]


class PolicyReads:
    """Read access to a store's active set (``_set``) and its versions (``active_dir``, ``versions_dir``)."""

    active_dir: Path
    versions_dir: Path
    version: int
    _set: PolicySet

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

    def versions(self, *, limit: int = 50, before: int | None = None) -> list[dict[str, Any]]:
        """The committed versions, newest first (:func:`policy.store_versions.version_entries`: change
        records and set digests, never policy text). Raises ValueError for a bad ``limit``."""
        return version_entries(self.active_dir, self.versions_dir, limit=limit, before=before)

    def drift(self) -> dict[str, Any]:
        """Whether the active set is the committed set of the version in force (session 25, S25-newcomer-8):
        ``{"active_set_sha256", "in_force_set_sha256", "drift"}`` (:func:`policy.store_versions.drift_state`;
        digests only, never policy text). Reads one file; never raises."""
        return drift_state(self.versions_dir, self.version, self._set)

    def history(self) -> list[ChangeRecord]:
        """All committed change records, oldest first."""
        return [ChangeRecord(**doc) for doc in committed_records(self.active_dir, self.versions_dir)]

