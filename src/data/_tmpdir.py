"""Temporary folders that become datasets by one rename, and the clean-up of those a killed writer left behind.

A writer builds its dataset in a hidden `.tmp-<name>-XXXX` folder beside the destination and renames it into place
when done, so an interrupted run never leaves a partial dataset under the real name. A run killed with SIGKILL
cannot remove its temporary folder, so every such folder holds a lock file that its writer keeps locked
(`flock`) while it lives: the kernel drops the lock when the process dies, however it dies. The next writer in
the same parent folder removes every `.tmp-*` folder whose lock file it can take, and nothing else: folders of
other tools (no lock file) and of writers still running (lock held) are left alone.
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
from pathlib import Path

LOCK_NAME = ".longctx-writing.lock"
log = logging.getLogger("longctx.data")


@contextlib.contextmanager
def writing_dir(parent: Path, name: str):
    """Yield a fresh private folder `parent/.tmp-<name>-XXXX`, locked as ours until the block ends; removed at the
    end unless the caller renamed it away (call `release(tmp)` just before renaming it: the lock file must not
    travel into the finished dataset)."""
    parent = Path(parent)
    clean_stale(parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=parent))
    fd = os.open(tmp / LOCK_NAME, os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield tmp
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        os.close(fd)  # the lock goes last: a cleaner never sees this folder unlocked while it exists


def release(tmp: Path) -> None:
    """Remove the lock file of a finished temporary folder (its fd, and so the lock, stay held until the end of
    `writing_dir`)."""
    (Path(tmp) / LOCK_NAME).unlink(missing_ok=True)


def clean_stale(parent: Path) -> list[Path]:
    """Remove the `.tmp-*` folders in `parent` that a dead writer of ours left behind; return them."""
    removed = []
    try:
        entries = list(Path(parent).iterdir())
    except OSError:
        return removed
    for d in entries:
        if not (d.name.startswith(".tmp-") and d.is_dir() and not d.is_symlink()):
            continue
        try:
            fd = os.open(d / LOCK_NAME, os.O_RDWR)
        except OSError:
            continue  # not ours, or being renamed into place right now
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its writer is alive (or the file system cannot tell: leave it)
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
            log.warning(f"removed {str(d)!r}, the temporary folder of an interrupted dataset write")
        finally:
            os.close(fd)
    return removed


@contextlib.contextmanager
def one_writer(parent: Path, name: str):
    """Hold `parent/.<name>.lock` (flock, blocking) for the block, so that processes which need the same dataset at
    once (several runs started together) wait for the first one's write instead of each writing it again. The
    caller checks again for the finished dataset inside the block."""
    fd = os.open(Path(parent) / f".{name}.lock", os.O_CREAT | os.O_WRONLY, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def generate_once(cache_dir, name: str, params: dict, generate) -> Path:
    """`cache_dir/name`, a generated dataset, made on first use: `generate(folder, params)` writes it into a
    temporary folder that gets `params.json` and is renamed into place, so an interrupted generation leaves nothing
    under the real name and runs started together generate it once (the others wait, then read it)."""
    import json

    cache = Path(os.path.expanduser(str(cache_dir)))
    root = cache / name
    if (root / "params.json").exists():
        return root
    try:  # a folder that cannot be made or written: named now, not as the traceback of a generation half begun
        cache.mkdir(parents=True, exist_ok=True)
        if not os.access(cache, os.W_OK | os.X_OK):
            raise PermissionError(13, "not writable")
    except OSError as err:
        raise ValueError(f"data.cache_dir={str(cache_dir)!r} (the config's cache_dir, or $LONGCTX_CACHE): cannot hold "
                         f"the generated data ({err.strerror or err}); give a writable folder") from None
    with one_writer(cache, root.name):
        if (root / "params.json").exists():
            return root
        with writing_dir(cache, root.name) as tmp:  # also removes what a killed generation left in cache
            generate(tmp, params)
            (tmp / "params.json").write_text(json.dumps(params, indent=2, sort_keys=True) + "\n")
            release(tmp)
            try:
                os.rename(tmp, root)
                os.chmod(root, 0o777 & ~_umask())  # mkdtemp made it private
            except OSError:
                if not (root / "params.json").exists():  # not a concurrent writer that finished first
                    raise
    return root


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
