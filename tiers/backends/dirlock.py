"""One process per embedded data dir: an exclusive OS lock on ``<data dir>/tiermem.lock``.

The embedded stores (SQLite in WAL mode, embedded Chroma) live in one folder,
and embedded Chroma keeps state in the process that opened it: a second
process on the same folder would serve its own view and diverge silently. So
whoever opens the embedded stores first takes ``flock(LOCK_EX)`` on the lock
file and keeps it until it closes; anyone else gets :class:`DataDirLockedError`
naming the folder and the holder's pid (written into the lock file).

``flock`` locks belong to the open file, so the OS drops the lock when the
holder's process dies, SIGKILL included: there is never a stale lock to clean
up. A second open in the same process opens the file again and is refused
like another process (an error, not a deadlock). A child forked by the holder
closes its copy of the descriptor, so it does not keep the lock when the
holder dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import weakref
from pathlib import Path

from tiers.errors import BackendUnavailableError, DataDirLockedError

LOCK_FILE = "tiermem.lock"

# Descriptors of the locks this process holds, closed in a forked child (see the docstring).
_held: set[int] = set()
_held_lock = threading.Lock()


def _close_in_child() -> None:
    # A plain close: the lock stays with the parent's copy of the open file.
    for fd in list(_held):
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_close_in_child)


def _release(fd: int) -> None:
    with _held_lock:
        if fd not in _held:
            return
        _held.discard(fd)
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
    with contextlib.suppress(OSError):
        os.close(fd)


class DataDirLock:
    """The exclusive lock of one embedded data dir, held until :meth:`release`.

    Args:
        data_dir: The folder; created if missing.

    Raises:
        DataDirLockedError: Another process, or another open instance in this
            process, holds the lock.
        BackendUnavailableError: The lock file cannot be created or opened.
    """

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / LOCK_FILE
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise BackendUnavailableError(
                f"cannot create the lock file of the data dir {self.data_dir}: {exc}"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise _locked(self.data_dir, pid) from None
        except OSError as exc:
            os.close(fd)
            raise BackendUnavailableError(
                f"cannot lock the data dir {self.data_dir}: {exc}"
            ) from exc
        with _held_lock:
            _held.add(fd)
        self._fd = fd
        # Who holds it, for the error the next opener gets.
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        # An instance dropped without close() (a crashed test, a notebook cell) lets go
        # when it is collected, like the file it holds would.
        self._finalizer = weakref.finalize(self, _release, fd)

    @property
    def held(self) -> bool:
        """Whether this object still holds the lock."""
        return self._finalizer.alive

    def release(self) -> None:
        """Release the lock (idempotent)."""
        self._finalizer()


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _locked(data_dir: Path, pid: int | None) -> DataDirLockedError:
    if pid == os.getpid():
        who = f"this process (pid {pid}) has it open already: close that instance first"
    elif pid is not None:
        who = (
            f"process pid {pid} has it open: stop that process first, or, if it is a "
            "`tiermem serve`, go through its HTTP API"
        )
    else:
        who = "another process has it open: stop that process first"
    return DataDirLockedError(
        f"the data dir {data_dir} is in use: one process per embedded data dir, and {who}",
        data_dir=str(data_dir),
        pid=pid,
    )
