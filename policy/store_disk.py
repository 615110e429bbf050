"""A policy change on disk: staged files, one commit point, and a roll-back journal (S17-5, R17-3, SF17-2).

:class:`policy.store.PolicyStore` writes a change through :class:`ChangeFiles`, in this order:

1. **arm the journal**: ``<active_dir>/.pg-journal/undo.json`` records the set in force (the last
   committed one), the change's record and the previous text (or absence) of every active path the change
   stages (R18-4); written and fsynced in a temporary directory, then renamed
   in one ``rename(2)``. While it exists, :func:`policy.loader.load_policy_dir` reads that set instead of
   the files (every reader sees the committed set, whatever a crash left half renamed);
2. **stage**: the version directory as ``versions/.staged-<N>-*`` (``record.json``, ``content``) and the
   active files under temporary names (a file that cannot be written: everything removed, nothing applied);
3. the store applies the change to its target (embedded engine or remote OPA);
4. **rename** the active files in place (file by file) and the staged version directory to
   ``versions/<N>`` (one rename);
5. **commit**: rename the journal away (one rename; then removed).

A failure in 4-5 (or a target refusal in 3) runs :func:`restore`, the same code a restart runs: the
paths the change staged get their previous text back (no other file is touched), ``versions/<N>`` and the
staged files removed, and the journal removed last. A crash anywhere before 5 is rolled back by the next start (the change never
answered 200 nor reached the audit); after 5 the change is committed. This is SQLite's rollback journal
(https://www.sqlite.org/atomiccommit.html, "hot journal" on open) applied to a directory; a directory
swap (Kubernetes' AtomicWriter: a ``..data`` symlink renamed over) would turn the operator's policy
directory into symlinks and needs every file read through them, and ``renameat2(RENAME_EXCHANGE)`` of the
whole directory fails on a mount point (a container volume).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from policy.loader import (
    JOURNAL,
    PolicySet,
    canonical_json,
    check_data_path,
    check_module_id,
    policy_set_document,
    policy_set_from_document,
    sha256_text,
)

__all__ = ["SNAPSHOT", "ChangeFiles", "StagedFiles", "active_files", "committed_records", "committed_versions",
           "pending_version",
           "policy_set_document", "policy_set_from_document", "restore", "set_digest"]

_STAGED = ".staged-"
#: a version's whole set after its change (session 24, S23-newcomer-3: what a roll-back puts back)
SNAPSHOT = "set.json"


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp")


def _fsync(path: Path) -> None:
    """fsync a file or a directory (a rename is durable once its directory is)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _needed(files: Mapping[Path, str | None]) -> dict[Path, str | None]:
    """``files`` without what the disk holds already: a path to delete that is absent, a file whose
    text is the same (a JSON file: the same value, so an operator's formatting stays when unchanged)."""
    out: dict[Path, str | None] = {}
    for path, text in files.items():
        if text is None:
            if path.exists() or path.is_symlink():
                out[path] = None
            continue
        try:
            cur = path.read_text("utf-8")
            same = cur == text or (path.suffix == ".json" and json.loads(cur) == json.loads(text))
        except (OSError, ValueError):
            same = False
        if not same:
            out[path] = text
    return out


def _write_dir(parent: Path, prefix: str, files: Mapping[str, str]) -> Path:
    """A new directory ``parent/<prefix><random>`` holding ``files`` (name -> text), fsynced."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        for name, text in files.items():
            (tmp / name).write_text(text, "utf-8")
            _fsync(tmp / name)
        _fsync(tmp)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


class StagedFiles:
    """Files written under temporary names, waiting for :meth:`commit` or :meth:`discard`.

    Args:
        files: final path -> text (UTF-8), or None to delete the path at commit. Renamed in this
            order.

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
            OSError: a rename or delete failed (the files renamed before it stay renamed: a
                :class:`ChangeFiles` journal puts them back).
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


class ChangeFiles:
    """One change's files, steps 1-2 of the module doc at construction, 4-5 in :meth:`commit`.

    Args:
        active_dir, versions_dir: the store's directories.
        record: the change record (JSON object with ``version``), written as ``record.json``.
        before: the set in force (the journal's roll-back target).
        active: active-directory path -> text, or None to delete (:func:`active_files` for a whole set).
        content: the version's ``content`` file (None: none, a delete).
        snapshot: the version's ``set.json`` (the whole set after the change, canonical JSON of
            :func:`policy_set_document`; session 24: what a roll-back to this version puts back), or None.

    Raises:
        FileExistsError: ``versions/<version>`` exists already, or a journal is armed (an earlier
            roll-back not finished: :func:`restore` first).
        OSError: a file cannot be written; nothing is left behind and nothing is applied.
    """

    def __init__(self, active_dir: Path, versions_dir: Path, record: Mapping[str, Any], before: PolicySet,
                 active: Mapping[Path, str | None], content: str | None, snapshot: str | None = None) -> None:
        self.active_dir, self.versions_dir = active_dir, versions_dir
        self.vdir = versions_dir / f"{int(record['version']):08d}"
        if self.vdir.exists() or self.vdir.is_symlink():
            raise FileExistsError(f"policy version directory {self.vdir} exists already")
        journal = active_dir / JOURNAL
        if journal.exists():
            raise FileExistsError(f"{journal}: an earlier change is not rolled back yet")
        needed = _needed(active)
        undo = json.dumps({"record": dict(record), "set": policy_set_document(before),
                           "files": _previous(active_dir, needed)}, sort_keys=True)
        armed = _write_dir(active_dir, f"{JOURNAL}.new-", {"undo.json": undo})
        try:
            os.rename(armed, journal)  # 1. armed: readers see ``before`` from here until the commit
            _fsync(active_dir)
        except OSError:
            shutil.rmtree(armed, ignore_errors=True)
            raise
        try:  # 2. stage
            files = {"record.json": json.dumps(dict(record), sort_keys=True)}
            if content is not None:
                files["content"] = content
            if snapshot is not None:
                files[SNAPSHOT] = snapshot
            self._staged = _write_dir(versions_dir, f"{_STAGED}{int(record['version']):08d}-", files)
            self._active = StagedFiles(needed)
        except OSError:
            self.roll_back()
            raise

    def commit(self) -> None:
        """4. rename the active files and the version directory; 5. commit (the journal renamed away).

        Raises:
            OSError: a rename failed; nothing is committed (call :meth:`roll_back`).
        """
        self._active.commit()
        os.rename(self._staged, self.vdir)
        _fsync(self.versions_dir)
        done = self.active_dir / f"{JOURNAL}.old-{secrets.token_hex(4)}"
        os.rename(self.active_dir / JOURNAL, done)  # the commit point: nothing after it may fail the change
        try:
            _fsync(self.active_dir)
        except OSError:
            pass
        shutil.rmtree(done, ignore_errors=True)

    def roll_back(self) -> bool:
        """Put the disk back to the journal's set (:func:`restore`); True when done, False when the
        journal stays armed (logged by the caller; the next change or a restart finishes it). Never raises."""
        try:
            restore(self.active_dir, self.versions_dir)
        except (OSError, ValueError):
            return False
        return True


def pending_version(active_dir: Path) -> int | None:
    """The version of the change an armed journal holds uncommitted (its ``versions/<N>`` may exist
    and is not part of the history); None without a journal or when it cannot be read."""
    try:
        return int(json.loads((active_dir / JOURNAL / "undo.json").read_text("utf-8"))["record"]["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def committed_versions(active_dir: Path, versions_dir: Path) -> list[int]:
    """The committed version numbers on disk (not the one an armed journal holds uncommitted), unsorted."""
    pending = pending_version(active_dir)
    return [int(p.name) for p in versions_dir.iterdir() if p.name.isdigit() and int(p.name) != pending]


def committed_records(active_dir: Path, versions_dir: Path) -> list[dict[str, Any]]:
    """The ``record.json`` documents of the committed versions, oldest first.

    Raises:
        OSError, ValueError: a record cannot be read or is not JSON.
    """
    out = []
    for version in sorted(committed_versions(active_dir, versions_dir)):
        rec = versions_dir / f"{version:08d}" / "record.json"
        if rec.is_file():
            out.append(json.loads(rec.read_text("utf-8")))
    return out


def restore(active_dir: Path, versions_dir: Path) -> dict[str, Any] | None:
    """Roll back an uncommitted change (an armed journal) and remove what staging left behind.

    Run at every start (:class:`policy.store.PolicyStore`) and after a failed change. With a journal:
    the paths the change staged are given their previous text back (or removed when they were absent;
    R18-4: no other file of the directory is touched; a journal written before session 18's review
    fixes, without ``files``, rewrites the whole directory to its set, :func:`active_files`), the version directory of its
    record removed (written by this uncommitted change: a version is committed only with the journal's
    removal), then the journal removed. Always: staged version directories, ``.*.tmp`` files of the
    active directory and unfinished journal directories are removed.

    Returns:
        the rolled-back change's record (JSON object), None when no journal was armed.

    Raises:
        OSError: a file could not be rewritten or removed; the journal stays (the loader keeps reading
            the committed set) and the next call tries again.
        ValueError: an unreadable journal (the loader refuses the directory the same way).
    """
    journal = active_dir / JOURNAL
    record = None
    if journal.exists():
        try:
            doc = json.loads((journal / "undo.json").read_text("utf-8"))
            record, before = dict(doc["record"]), policy_set_from_document(doc["set"])
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{journal}: unreadable change journal") from exc
        files = doc.get("files")  # R18-4: the paths this change staged; a journal without them: the whole set
        StagedFiles(_needed(active_files(active_dir, before) if files is None else
                            _journal_files(active_dir, files, journal))).commit()
        vdir = versions_dir / f"{int(record['version']):08d}"
        if vdir.is_dir() and not vdir.is_symlink():
            shutil.rmtree(vdir)
        os.rename(journal, active_dir / f"{JOURNAL}.old-{secrets.token_hex(4)}")
        _fsync(active_dir)
    for path in (*versions_dir.glob(f"{_STAGED}*"), *active_dir.glob(f"{JOURNAL}.*")):
        shutil.rmtree(path, ignore_errors=True)
    for path in active_dir.rglob(".*.tmp"):
        path.unlink(missing_ok=True)
    return record


def _previous(active_dir: Path, files: Mapping[Path, str | None]) -> dict[str, str | None]:
    """What the paths a change stages hold now (relative path -> text, None when absent): the journal's
    roll-back touches only these (R18-4; SQLite's journal holds only the pages a transaction changes).

    Raises:
        OSError: a path cannot be read (nothing armed yet). ValueError: a file that is not UTF-8 text.
    """
    out: dict[str, str | None] = {}
    for path in files:
        rel = path.relative_to(active_dir).as_posix()
        try:
            out[rel] = path.read_text("utf-8")
        except FileNotFoundError:
            out[rel] = None
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: not UTF-8 text; the change cannot journal it") from exc
    return out


def _journal_files(active_dir: Path, files: Any, journal: Path) -> dict[Path, str | None]:
    """The journal's ``files`` (relative path -> previous text or None) as paths inside ``active_dir``.

    Raises:
        ValueError: not an object of relative paths inside the directory to text or null.
    """
    if not isinstance(files, dict):
        raise ValueError(f"{journal}: unreadable change journal")
    out: dict[Path, str | None] = {}
    for rel, text in files.items():
        parts = Path(rel).parts if isinstance(rel, str) else ()
        if not parts or Path(rel).is_absolute() or ".." in parts or not (text is None or isinstance(text, str)):
            raise ValueError(f"{journal}: unreadable change journal")
        out[active_dir.joinpath(*parts)] = text
    return out


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
