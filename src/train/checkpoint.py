"""Checkpoints written atomically (temp file, fsync, rename), the newest `keep` kept.

A checkpoint is one file `step_XXXXXXXX.pt` in `<run_dir>/checkpoints/`; a file only ever appears under its
final name complete, so whatever is found there can be loaded, even after a kill -9 mid-write.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import torch

_NAME = re.compile(r"^step_(\d{8})\.pt$")


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint, oldest first."""
    folder = checkpoint_dir(run_dir)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), folder / name) for name in os.listdir(folder) if (m := _NAME.match(name))]
    return sorted(found)


def latest_checkpoint(run_dir: str | Path) -> tuple[int, Path] | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(run_dir: str | Path, step: int, state: dict, keep: int) -> Path:
    folder = checkpoint_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"step_{step:08d}.pt"
    tmp = folder / f".step_{step:08d}.pt.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    _fsync_dir(folder)
    for stale in folder.glob(".step_*.pt.tmp*"):  # left by a process killed mid-write
        stale.unlink(missing_ok=True)
    for _, old in list_checkpoints(run_dir)[:-keep]:
        old.unlink(missing_ok=True)
    return final


def load_checkpoint(path: str | Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)
