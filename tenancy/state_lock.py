"""Who may write the key-state file: running gateways (shared) or one offline command (exclusive).

R11-1: ``prefixgate keys rotate-salt`` run against the state file of a *running*
gateway reported success, was never used by that gateway (its key ring is in
memory) and was undone by the gateway's next write of the file. Now:

* every process whose key ring serves traffic (a gateway, each ``serve --workers``
  process) holds ``flock(LOCK_SH)`` on ``<state_file>.lock`` for as long as its
  ring lives (:func:`hold_shared`; they do not exclude each other);
* an offline write command takes ``flock(LOCK_EX | LOCK_NB)`` on the same file
  (:func:`take_exclusive`) and is refused (:class:`StateInUse`) while any gateway
  holds its shared lock; a gateway starting meanwhile waits up to ``START_WAIT_S``;
* the read-merge-write of the state file (:meth:`StateLock.writing`) is serialised
  between the processes sharing it by a POSIX record lock (``fcntl.lockf``,
  blocking) on the same descriptor. On Linux ``flock`` and POSIX record locks are
  independent of each other (flock(2), "NOTES"), so this never meets the shared
  ``flock``; threads of one process are serialised by the key ring's own lock.

Advisory locks: they bind the processes that use this module (the gateway and
``prefixgate keys``), not an editor or a script writing the file; the forward-only
merge (:func:`tenancy.state.merge_forward`) covers those. Linux only (``fcntl``;
``flock`` on NFS is emulated with record locks there and is not supported). The
lock file is empty, mode 0600, and is never removed (removing it while held would
let a second holder lock a new inode).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
import weakref
from collections.abc import Callable, Iterator

from tenancy.master_secret import KeyRingError
from tenancy.state import KeyState, StateError, load_state, merge_forward, save_state

__all__ = ["LOCK_MODES", "START_WAIT_S", "KeyStateDirectoryMissing", "KeyStateInUse", "StateFile", "StateInUse",
           "StateLock", "gateway_running", "hold_shared", "lock_path", "missing_directory", "take_exclusive"]

#: Seconds a starting gateway waits for an offline command's exclusive lock to go (it holds it for ms).
START_WAIT_S = 5.0
_POLL_S = 0.05


class StateInUse(StateError):
    """The lock is held in a conflicting mode: a running gateway (for an offline writer) or an
    offline command still writing (for a starting gateway)."""


class KeyStateDirectoryMissing(KeyRingError):
    """The state file's directory does not exist: nothing can lock or write it (S21-newcomer-2)."""


def missing_directory(state_path: str) -> str | None:
    """Why the state file ``state_path`` cannot be locked or written because its directory does not exist
    (an operator-facing sentence naming the directory and what to create), or None when it exists.

    The gateway never creates it (audit directories it does create): a missing key-state directory is
    often an unmounted volume, and state written elsewhere would silently lose every rotation at the next
    start; its owner and mode are the operator's choice (session 21, S21-newcomer-2)."""
    directory = os.path.dirname(os.path.abspath(state_path))
    if os.path.isdir(directory):
        return None
    return (f"the key-state directory {directory} does not exist: create it for the gateway's user "
            f"(e.g. install -d -m 0700 -o <gateway user> {directory}), or point tenancy.state_file elsewhere; "
            f"key and salt rotations cannot be saved to {state_path} until it exists")


def lock_path(state_path: str) -> str:
    """The lock file of the state file ``state_path``: its resolved path (symbolic links followed,
    so two spellings of one file share one lock: review R11c-3) + ``".lock"``."""
    return os.path.realpath(state_path) + ".lock"


class StateLock:
    """An open lock-file descriptor holding a ``flock`` (``mode`` ``"shared"`` or ``"exclusive"``).

    Released by :meth:`close`, when the object is garbage-collected, or by the
    kernel when the process exits.
    """

    def __init__(self, fd: int, path: str, mode: str) -> None:
        self.path = path
        self.mode = mode
        self._fd = fd
        self._finalizer = weakref.finalize(self, os.close, fd)

    @property
    def held(self) -> bool:
        """True until :meth:`close`."""
        return self._finalizer.alive

    def close(self) -> None:
        """Release the lock (idempotent)."""
        self._finalizer()

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Serialise one read-merge-write of the state file between processes (blocking
        ``lockf(LOCK_EX)`` on this descriptor). Raises :class:`StateError` once closed."""
        if not self.held:
            raise StateError(f"key-state lock {self.path} released: not writing")
        fcntl.lockf(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)


def _open(state_path: str) -> tuple[int, str]:
    path = lock_path(state_path)
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600), path


def hold_shared(state_path: str, *, wait_s: float = START_WAIT_S,
                clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
                ) -> StateLock:
    """Take the running gateway's shared lock on ``state_path``'s lock file.

    Waits up to ``wait_s`` seconds for an offline command's exclusive lock to go.
    Raises :class:`StateInUse` after that, ``OSError`` when the lock file cannot be
    created (e.g. its directory does not exist).
    """
    fd, path = _open(state_path)
    deadline = clock() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return StateLock(fd, path, "shared")
        except BlockingIOError:
            if clock() >= deadline:
                os.close(fd)
                raise StateInUse(f"key state {state_path} is locked by an offline `prefixgate keys` command "
                                 f"({path}); retry when it has finished") from None
            sleep(_POLL_S)
        except BaseException:
            os.close(fd)
            raise


def take_exclusive(state_path: str) -> StateLock:
    """Take the offline writer's exclusive lock on ``state_path``'s lock file, without waiting.

    Raises :class:`StateInUse` while any gateway (or another offline command)
    holds the lock; ``OSError`` when the lock file cannot be created.
    """
    fd, path = _open(state_path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StateInUse(f"a running gateway (or another `prefixgate keys` command) holds the key state "
                         f"{state_path} ({path})") from None
    except BaseException:
        os.close(fd)
        raise
    return StateLock(fd, path, "exclusive")


def gateway_running(state_path: str) -> bool | None:
    """Whether some process holds ``state_path``'s lock now (a probe: takes and drops the exclusive
    lock on a read-only descriptor; a missing lock file means none, and the probe never creates it,
    so a read-only command run as another user leaves no lock file the gateway cannot open: review
    R11c-2). None when the lock file exists but cannot be opened."""
    try:
        fd = os.open(lock_path(state_path), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)
    return False


class KeyStateInUse(KeyRingError):
    """The state file's lock is held in a conflicting mode: a running gateway (for an offline
    ``"exclusive"`` writer) or an offline command still writing (for a starting gateway)."""


#: ``StateFile`` modes: a ring serving traffic, an offline writer, a reader.
LOCK_MODES = ("shared", "exclusive", None)


class StateFile:
    """The key ring's state file (``path``) and its lock, taken per ``mode`` (:data:`LOCK_MODES`).

    ``"shared"``: :func:`hold_shared` now; ``"exclusive"``: :func:`take_exclusive` now; ``None``:
    no lock, :meth:`write` refuses. Raises :class:`KeyStateInUse` (conflicting
    holder), :class:`KeyStateDirectoryMissing` (the file's directory does not exist, either
    locking mode: since session 21, S21-newcomer-2, a shared holder no longer defers the lock to
    the first write), :class:`KeyRingError` (an exclusive lock that cannot be created),
    ``ValueError`` (another mode).
    """

    def __init__(self, path: str, mode: str | None = "shared") -> None:
        if mode not in LOCK_MODES:
            raise ValueError(f"state_lock must be one of {LOCK_MODES}")
        self.path = path
        self.mode = mode
        self.lock: StateLock | None = None
        self._take()

    def _take(self) -> None:
        try:
            if self.mode == "shared":
                self.lock = hold_shared(self.path)
            elif self.mode == "exclusive":
                self.lock = take_exclusive(self.path)
        except StateInUse as exc:
            raise KeyStateInUse(str(exc)) from None
        except FileNotFoundError as exc:
            # S21-newcomer-2: refused in both modes (a gateway used to start and answer every rotation 500)
            if (missing := missing_directory(self.path)) is not None:
                raise KeyStateDirectoryMissing(missing) from None
            raise KeyRingError(f"cannot lock key state {lock_path(self.path)}: {exc.strerror}") from None
        except OSError as exc:
            # any other reason (a lock file another user owns, e.g. left by `sudo prefixgate keys`; not a
            # regular file): fail closed rather than run without the lock (review R11c-2)
            raise KeyStateInUse(f"cannot lock key state {lock_path(self.path)}: {exc.strerror}; "
                                "give the gateway's user read-write access to it") from None

    def load(self) -> KeyState:
        """The file's state (empty when missing). Raises :class:`KeyRingError` (unreadable, bad shape)."""
        try:
            return load_state(self.path)
        except StateError as exc:
            raise KeyRingError(str(exc)) from exc

    def write(self, mine: KeyState, change: Callable[[KeyState], KeyState]) -> KeyState:
        """Under the write lock: read the file, merge it forward with ``mine``
        (:func:`tenancy.state.merge_forward`), write ``change(merged)`` and return it.
        Raises :class:`KeyRingError` when nothing could be written (read-only, lock, I/O)."""
        if self.mode is None:
            raise KeyRingError("key state opened read-only: not writing the state file")
        if self.lock is None or not self.lock.held:
            self._take()
        if self.lock is None:
            raise KeyRingError(f"cannot lock key state {lock_path(self.path)}")
        try:
            with self.lock.writing():
                written = change(merge_forward(mine, self.load()))
                save_state(self.path, written)
        except (StateError, OSError) as exc:  # OSError: the record lock
            if (missing := missing_directory(self.path)) is not None:  # removed after the start
                raise KeyStateDirectoryMissing(missing) from exc
            if isinstance(exc, StateError):
                raise KeyRingError(str(exc)) from exc
            raise KeyRingError(f"cannot lock key state {lock_path(self.path)}: {exc.strerror}") from exc
        return written

    def close(self) -> None:
        """Release the lock (idempotent); a later :meth:`write` takes it again."""
        if self.lock is not None:
            self.lock.close()
            self.lock = None
