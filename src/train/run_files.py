"""Writing files in a run folder without following links.

A run folder may be shared, copied or tampered with: a file name in it that is a symbolic link must never make a
launch write where the link points. New files are created with `O_EXCL | O_NOFOLLOW` (a link or any existing entry
of that name is refused by the kernel) under a fresh name, then renamed over the final name: a rename replaces a
link itself, never its target. Appends open with `O_NOFOLLOW`.

    write_atomic(run_dir / "config.yaml", text)          # whole or not at all, even after a kill -9
    with open_new(tmp_path) as f: torch.save(state, f)   # a fresh file of exactly this name
    with open_append(run_dir / "metrics.jsonl") as f: f.write(line)
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path

# The files a launch writes or appends to at the top of its run folder under their own names (train.log: the
# console's copy); a link there is refused rather than replaced
RUN_FILES = (".lock", "config.yaml", "provenance.json", "provenance.diff", "metrics.jsonl", "wandb_id", "train.log",
             "icl_curves.png", "data_identity.json", "stages.json", "tokenizer.json")


def open_new(path: str | Path, mode: str = "wb"):
    """A new file at `path`, opened for writing: fails (FileExistsError) if anything, a link included, is there."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o666)
    return os.fdopen(fd, mode)


def open_append(path: str | Path, mode: str = "a"):
    """`path` opened for appending (created if absent); a link there raises OSError (ELOOP) instead of being
    followed."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o666)
    return os.fdopen(fd, mode)


def temp_name(path: str | Path) -> Path:
    """A fresh hidden name beside `path` for its temporary copy."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp{os.getpid()}-{secrets.token_hex(4)}")


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write `data` to `path` whole or not at all: a new temp file beside it, fsync, renamed over `path` (a link
    there is replaced, its target untouched)."""
    path = Path(path)
    tmp = temp_name(path)
    try:
        with open_new(tmp) as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    return path


# Files a launch writes once its checks pass: one of them in a folder means a launch ran there
LAUNCH_FILES = ("data_identity.json", "config.yaml", "provenance.json", "train.log", "metrics.jsonl")


def launched_before(run_dir: str | Path) -> bool:
    """Whether a launch got past its checks in `run_dir` (a folder holding only a `.lock` saw none)."""
    return any((Path(run_dir) / name).exists() for name in LAUNCH_FILES)


def _aside_name(path: Path, tag: str, k: int, after_name: bool) -> Path:
    number = k if k > 1 else ""
    if after_name:
        return path.with_name(f"{path.name}.{tag}{number}")
    return path.with_name(f"{path.stem}.{tag}{number}{path.suffix}")


def set_aside(paths, tag: str, after_name: bool = False) -> list[Path]:
    """Rename each of `paths` (those that exist) to `<stem>.<tag>[k]<suffix>` beside it (`after_name`:
    `<name>.<tag>[k]`), with one k for all of them, the first that is free for every name given, there or not
    (metrics.before_restart.jsonl and config.before_restart.yaml, then ...before_restart2...): kept, never
    overwritten, and a number is never shared with the files of another set-aside. Returns the new paths."""
    given = [Path(p) for p in paths]
    k = 1
    while any(_aside_name(p, tag, k, after_name).exists() or _aside_name(p, tag, k, after_name).is_symlink()
              for p in given):
        k += 1
    moved = []
    for p in (p for p in given if p.exists() or p.is_symlink()):
        moved.append(_aside_name(p, tag, k, after_name))
        p.rename(moved[-1])
    return moved


def linked_run_files(run_dir: str | Path) -> list[Path]:
    """The entries of RUN_FILES in `run_dir` that are symbolic links."""
    return [Path(run_dir) / name for name in RUN_FILES if (Path(run_dir) / name).is_symlink()]


RUN_FOLDERS = ("checkpoints", "eval", "per_position_loss")  # the folders a launch writes into


def check_entry_kinds(run_dir: str | Path) -> None:
    """Refuse a run folder where a file a launch writes is a folder, or a folder it writes into is a file (one line,
    naming it): found before training, not at the first evaluation or checkpoint."""
    run_dir = Path(run_dir)
    for name in RUN_FILES:
        if (run_dir / name).is_dir():
            raise ValueError(f"run_dir={str(run_dir)!r}: {run_dir / name} is a folder, where the run writes a file; "
                             f"move it away. Nothing was written.")
    for name in RUN_FOLDERS:
        path = run_dir / name
        if (path.exists() or path.is_symlink()) and not path.is_dir():
            raise ValueError(f"run_dir={str(run_dir)!r}: {path} is not a folder, where the run writes its {name}; "
                             f"move it away. Nothing was written.")


def check_no_links(run_dir: str | Path) -> None:
    """Refuse a run folder whose files a launch writes are symbolic links (one line, naming the first)."""
    linked = linked_run_files(run_dir)
    if linked:
        raise ValueError(f"run_dir={str(run_dir)!r}: {linked[0]} is a symbolic link (to {os.readlink(linked[0])!r}); "
                         f"a run never writes through links: replace it by the file itself, or remove it. Nothing "
                         f"was written.")
