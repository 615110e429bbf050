"""Staged writes of a policy change: every file written under a temporary name first, renamed after.

:class:`policy.store.PolicyStore` stages a change's files (version record, version content, the
active set's files) *before* it applies the change to its target, and renames them only once the
target took it (session 17, S17-5: a change in force must be on disk, and a change that cannot be
written must never be in force). A rename in one directory is atomic (POSIX ``rename(2)``); a change
of several files is renamed file by file, the version's ``record.json`` last (the file that marks a
version as committed: :meth:`policy.store.PolicyStore.history` reads only directories that hold it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from policy.loader import PolicySet, canonical_json, check_data_path, check_module_id, sha256_text


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temporary name and a rename.

    Raises:
        OSError: the directory cannot be made or the file cannot be written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(path)
    tmp.write_text(text, "utf-8")
    os.replace(tmp, path)


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp")


class StagedFiles:
    """Files written under temporary names, waiting for :meth:`commit` or :meth:`discard`.

    Args:
        files: final path -> text (UTF-8), or None to delete the path at commit. Renamed in this
            order (put the file that marks the change as committed last).

    Raises:
        OSError: a directory cannot be made (e.g. a file is in the way), a final path exists as a
            directory, or a temporary file cannot be written; whatever was staged is removed first.
    """

    def __init__(self, files: Mapping[Path, str | None]) -> None:
        self._files = dict(files)
        self._made_dirs: list[Path] = []
        self._staged: list[Path] = []
        try:
            for path, text in self._files.items():
                if text is None:
                    continue
                if path.is_dir():
                    raise IsADirectoryError(f"{path} is a directory")
                self._mkdirs(path.parent)
                tmp = _tmp_name(path)
                tmp.write_text(text, "utf-8")
                self._staged.append(tmp)
        except OSError:
            self.discard()
            raise

    def _mkdirs(self, directory: Path) -> None:
        missing = []
        for d in (directory, *directory.parents):
            if d.is_dir():
                break
            missing.append(d)
        for d in reversed(missing):
            d.mkdir()  # raises FileExistsError when a file is in the way
            self._made_dirs.append(d)

    def commit(self) -> None:
        """Rename every staged file to its final name and delete the paths mapped to None.

        Raises:
            OSError: a rename or delete failed (the files renamed before it stay renamed).
        """
        for path, text in self._files.items():
            if text is None:
                path.unlink(missing_ok=True)
            else:
                os.replace(_tmp_name(path), path)
        self._staged = []
        self._made_dirs = []

    def discard(self) -> None:
        """Remove the staged temporary files and the directories made for them (never raises)."""
        for tmp in self._staged:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
        for d in reversed(self._made_dirs):
            try:
                d.rmdir()
            except OSError:
                pass
        self._staged = []
        self._made_dirs = []


def active_files(active_dir: Path, policy_set: PolicySet) -> dict[Path, str | None]:
    """The writes and deletes that make ``active_dir`` hold exactly ``policy_set``.

    Returns:
        path -> text to write, or None for a module or data file to delete (the layout of
        :mod:`policy.loader`: ``*.rego``, ``data/<path>.json``, ``data.json`` for the root document).

    Raises:
        ValueError: an unsafe module id or data path in ``policy_set``.
    """
    out: dict[Path, str | None] = {}
    for path in active_dir.glob("*.rego"):
        if path.name not in policy_set.modules:
            out[path] = None
    data_dir = active_dir / "data"
    wanted = {data_dir / f"{k}.json" for k in policy_set.data_docs if k}
    if data_dir.is_dir():
        for path in data_dir.rglob("*.json"):
            if path not in wanted:
                out[path] = None
    for module_id, source in policy_set.modules.items():
        out[active_dir / check_module_id(module_id)] = source
    for key, value in policy_set.data_docs.items():
        target = data_dir / f"{'/'.join(check_data_path(key))}.json" if key else active_dir / "data.json"
        out[target] = canonical_json(value)
    if "" not in policy_set.data_docs and (active_dir / "data.json").exists():
        out[active_dir / "data.json"] = None
    return out


def set_digest(policy_set: PolicySet) -> str | None:
    """SHA-256 hex of the canonical JSON of :func:`policy_set_document` (the ``*`` change records)."""
    return sha256_text(canonical_json(policy_set_document(policy_set)))


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
