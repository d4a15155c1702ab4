"""The run folder: a name that stays inside runs/ (or the sweep folder), a folder that can be written, and one
process at a time in it.

The lock is an exclusive `fcntl.flock` on `<run_dir>/.lock`, which records who holds it (pid, host, start time).
The kernel drops a flock when its process ends, even by kill -9, so a crashed run never leaves its folder held: the
next launch takes the lock over. A launch that finds the folder held fails naming the holder, having written
nothing. Released, the lock file is removed (under the lock; a launcher that opened it just before checks that
the file it locked is still the one in the folder).
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path, PurePath

LOCK_NAME = ".lock"


def check_run_name(name) -> None:
    """run_name names a folder inside runs/ (multirun: inside the sweep folder): relative, no `..` component."""
    text = str(name)
    why = None
    if not text.strip():
        why = "is empty"
    elif PurePath(text).is_absolute() or text.startswith("~"):
        why = "is an absolute path"
    elif any(part in ("..", ".") for part in text.replace("\\", "/").split("/")) or "\\" in text:
        why = "has a '.', '..' or '\\' path component"
    if why:
        raise ValueError(f"config: run_name={text!r}: {why}; the run folder must stay inside runs/ (use a plain "
                         f"name such as my_run, or hydra.run.dir=<folder> for another place)")


def check_writable_dir(path: Path, key: str) -> None:
    """The folder `path` (existing or to be made) can hold a run: it is not a file, and it (or the nearest folder
    above it that exists) is writable. `key` names it in the error (e.g. run_dir, hydra.sweep.dir)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{key}={str(path)!r} is a file, not a folder; pick another run_name or folder")
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ValueError(f"{key}={str(path)!r}: {str(probe)!r} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        what = "is" if probe == path else f"cannot be created: {str(probe)!r} is"
        raise ValueError(f"{key}={str(path)!r} {what} not writable; pick another folder")


class RunDirInUse(ValueError):
    """Another live process holds the run folder's lock."""


class RunLock:
    """The exclusive lock of one run folder; `acquire()` makes the folder if needed, `release()` undoes what a
    failed launch made (the lock file, and the folders it created if they are empty)."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self.file = None
        self.created: list[Path] = []   # folders this lock made, innermost first

    def acquire(self) -> None:
        check_writable_dir(self.run_dir, "run_dir")
        missing = []
        probe = self.run_dir
        while not probe.exists():
            missing.append(probe)
            probe = probe.parent
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.created = missing
            while True:
                handle = self._open_lock_file()
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    handle.seek(0)
                    holder = handle.read()
                    handle.close()
                    raise RunDirInUse(f"run_dir={str(self.run_dir)!r} is in use by {describe_holder(holder)} (lock "
                                      f"{self.path}); wait for it to end, or pick another run_name. Nothing was "
                                      f"written.") from None
                if _same_file(handle, self.path):
                    break
                handle.close()  # removed by its releasing holder after we opened it: take the new one
        except PermissionError as err:
            self._undo_folders()
            raise ValueError(f"run_dir={str(self.run_dir)!r} is not writable ({err.strerror}: "
                             f"{err.filename})") from None
        except BaseException:
            self._undo_folders()
            raise
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "start": time.strftime("%Y-%m-%d %H:%M:%S %Z")}) + "\n")
        handle.flush()
        self.file = handle

    def _open_lock_file(self):
        """The lock file, opened without following a link: a `.lock` that is a symbolic link is refused (taking it
        would truncate and write the link's target)."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o666)
        except OSError as err:
            if err.errno != errno.ELOOP:
                raise
            raise ValueError(f"run_dir={str(self.run_dir)!r}: its lock file {self.path} is a symbolic link (to "
                             f"{os.readlink(self.path)!r}); remove it and relaunch. Nothing was written.") from None
        return os.fdopen(fd, "r+")

    def release(self, undo: bool = False) -> None:
        """Drop the lock (removing its file); `undo`: a launch that failed its checks also removes the folders
        it made, when they are empty, so it leaves nothing behind."""
        if self.file is not None:
            try:
                self.path.unlink(missing_ok=True)
            finally:
                self.file.close()
                self.file = None
        if undo:
            self._undo_folders()

    def _undo_folders(self) -> None:
        for folder in self.created:
            try:
                folder.rmdir()  # only ever an empty folder
            except OSError:
                break
        self.created = []


def _same_file(handle, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(handle.fileno()), os.stat(path))
    except FileNotFoundError:
        return False


def describe_holder(text: str) -> str:
    try:
        holder = json.loads(text)
        return f"pid {holder['pid']} on host {holder['host']} (started {holder['start']})"
    except (ValueError, KeyError, TypeError):
        return "another process (it has not recorded itself yet)"
