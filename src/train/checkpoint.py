"""Checkpoints: one versioned schema, written atomically, read without running code.

A checkpoint is one file `step_XXXXXXXX.pt` in `<run_dir>/checkpoints/`, a dict (schema version 1):

    schema_version  1
    model, optimizer, scheduler, data, rng, trainer    the state_dict() of each Stateful part of the run
    config, spec                                        the run's resolved config and ModelSpec (plain dicts)

`trainer` holds the trainer's counters (step, tokens, elapsed, skipped_steps, wandb_id, and the training loss since
the last evaluation: train_loss_sum, train_loss_steps); `rng` every rank's RNG
states as tensors and plain numbers (train/rng.py). Files without `schema_version` are version 0 (the counters
at the top level, numpy's RNG state an ndarray) and are read into version 1's layout by `upgrade`.

Writing: a temp file, fsync, rename, so a file only ever appears under its final name complete, even after a kill
-9 mid-write; the newest `keep` are kept. A write that fails (a full disk) removes its temp file and raises one
line naming the file and the cause (CheckpointWriteError).

Reading: `torch.load(weights_only=True)`: tensors and plain Python values only (and, for version-0 files, numpy's
ndarray), so a crafted file cannot run code. `read` checks the schema and upgrades it; `read_newest` takes the
newest readable checkpoint of a run, saying which ones it skipped (cut short, a directory, a bad schema); one of a
newer schema version is never skipped (an older longctx would train over it): it stops the read, naming both versions.
Temp files are created exclusively under fresh names (run_files), so a link in the folder is never written through.

Beside each `step_XXXXXXXX.pt` the model's weights are also written as `step_XXXXXXXX.safetensors` (after the .pt,
with the same temp-file-and-rename pattern): tensors only, each tied parameter once (GPT-2's lm_head.weight is
wte.weight; the alias is in the file's metadata), with the run's config and spec as JSON metadata, so the weights
read without unpickling anything and with any safetensors reader. `read_weights` reads one back; a run folder shared
with only these files (and config.yaml) loads through longctx.runs.load_run. Checkpoints written before carry no
such file and load as before.
"""
from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Callable, Iterable, Protocol

import numpy as np
import torch

from longctx.train.rng import plain_rng_state
from longctx.train.run_files import open_new, temp_name

try:
    from numpy._core.multiarray import _reconstruct  # numpy >= 2
except ImportError:
    from numpy.core.multiarray import _reconstruct

SCHEMA_VERSION = 1
PARTS = ("model", "optimizer", "scheduler", "data", "rng", "trainer")  # what a resume restores
_NAME = re.compile(r"^step_(\d{8})\.pt$")
_WEIGHTS = re.compile(r"^step_(\d{8})\.safetensors$")
_TEMPS = (".step_*.pt.tmp*", ".step_*.safetensors.tmp*")  # run_files.temp_name's names of a checkpoint's temp files
log = logging.getLogger("longctx")
# numpy's RNG state in version-0 files is an ndarray: these globals rebuild one (and nothing else), under the
# name numpy 2 pickles it by and numpy 1's
_NUMPY_GLOBALS = [np.ndarray, np.dtype, type(np.dtype(np.uint32)), _reconstruct,
                  (_reconstruct, "numpy.core.multiarray._reconstruct")]


class Stateful(Protocol):
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: the message names the file and why (one line)."""


class NewerSchemaError(CheckpointError):
    """A checkpoint written by a newer longctx: never skipped for an older one (a resume would train over it)."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint that could not be written (disk full, permissions): names the file and the OS's reason."""


class Attributes:
    """Named attributes of an object as a Stateful part (the trainer's counters): missing ones take `defaults`."""

    def __init__(self, obj, defaults: dict):
        self.obj, self.defaults = obj, defaults

    def state_dict(self) -> dict:
        return {name: getattr(self.obj, name) for name in self.defaults}

    def load_state_dict(self, state: dict) -> None:
        """ValueError naming a counter whose saved value is not of its default's kind (an int count, a float sum, a
        non-negative number): a damaged checkpoint is refused here, not as a TypeError steps later."""
        for name, default in self.defaults.items():
            value = state.get(name, default)
            if isinstance(default, (int, float)) and not isinstance(default, bool):
                kinds = (int,) if isinstance(default, int) else (int, float)
                if isinstance(value, bool) or not isinstance(value, kinds) or value < 0:
                    raise ValueError(f"{name}={value!r} is not a {'count' if kinds == (int,) else 'number'} >= 0")
            setattr(self.obj, name, value)


# ----- folder ---------------------------------------------------------------------------------------------

def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def weights_path(path: str | Path) -> Path:
    """The safetensors file of the model weights beside checkpoint `path` (step_XXXXXXXX.safetensors)."""
    return Path(path).with_suffix(".safetensors")


def list_weights(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every step_XXXXXXXX.safetensors of the run, oldest first."""
    folder = checkpoint_dir(run_dir)
    if not folder.is_dir():
        return []
    return sorted((int(m.group(1)), folder / name) for name in os.listdir(folder) if (m := _WEIGHTS.match(name)))


def step_of(path: str | Path) -> int | None:
    """The step a checkpoint's file name says (step_00000400.pt -> 400), None for a name unlike a checkpoint's."""
    m = _NAME.match(Path(path).name)
    return int(m.group(1)) if m else None


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every entry named like a checkpoint, oldest first (readable or not: see `read`)."""
    folder = checkpoint_dir(run_dir)
    if not folder.is_dir():
        return []
    found = [(step, folder / name) for name in os.listdir(folder) if (step := step_of(name)) is not None]
    return sorted(found)


def latest_checkpoint(run_dir: str | Path) -> tuple[int, Path] | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def remove_stale_temps(run_dir: str | Path) -> list[Path]:
    """Delete the temp files of writes a killed process left behind; returns them."""
    folder = checkpoint_dir(run_dir)
    stale = sorted(p for pattern in _TEMPS for p in folder.glob(pattern)) if folder.is_dir() else []
    _remove(stale, "a temp file of an interrupted write")
    return stale


def _remove(paths: list[Path], what: str) -> None:
    """Delete files that are no longer needed; one that cannot be is said, never fatal (nothing is lost)."""
    for path in paths:
        try:
            path.unlink(missing_ok=True)
        except OSError as err:
            log.warning(f"could not remove {path} ({what}): {err.strerror or err}")


def check_writable(run_dir: str | Path, after_step: int) -> None:
    """A run continuing from `after_step` will write its later checkpoints: an entry of such a name that is not a
    file (a directory) would stop it at that write, after training; refuse now, naming it."""
    for step, path in list_checkpoints(run_dir):
        if step > after_step and not path.is_file():
            raise CheckpointError(f"{path} is not a checkpoint file but would receive the checkpoint of step {step}; "
                                  f"move it away and relaunch")


# ----- writing ----------------------------------------------------------------------------------------------

def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(run_dir: str | Path, step: int, state: dict, keep: int) -> Path:
    """Write `state` as the checkpoint of `step` (atomically), then keep only the newest `keep` checkpoint files."""
    folder = checkpoint_dir(run_dir)
    final = folder / f"step_{step:08d}.pt"
    tmp = temp_name(final)  # a fresh name, created exclusively: never an existing file or link
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open_new(tmp) as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(folder)
    except OSError as err:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # the folder itself could not be made: no temp file either
        cause = err.strerror or str(err) or type(err).__name__
        if err.filename and Path(err.filename) not in (tmp, final):
            cause += f": {err.filename}"
        raise CheckpointWriteError(f"could not write checkpoint {final}: {cause}; nothing was written there "
                                   f"(older checkpoints are kept)") from None
    if isinstance(state.get("model"), dict):
        save_weights(weights_path(final), state)
    remove_stale_temps(run_dir)
    old = [p for _, p in list_checkpoints(run_dir) if p.is_file()][:-keep]
    _remove(old + [weights_path(p) for p in old if weights_path(p).is_file()], f"beyond the newest {keep} kept")
    return final


def _tensor_key(t: torch.Tensor):
    return t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype


def save_weights(path: Path, state: dict) -> None:
    """The model part of checkpoint `state` as safetensors at `path` (atomically): each tensor once, a tied one
    recorded in the metadata under "tied" ({name: name of the tensor it is}), with "config" and "spec" as JSON."""
    try:
        from safetensors.torch import save
    except ImportError:  # transformers (FLA's dependency) brings it; without it the .pt alone is the checkpoint
        log.warning(f"{path.name} not written: writing checkpoint weights as safetensors needs the safetensors "
                    f"package (pip install 'longctx[hf]')")
        return
    first, tensors, tied = {}, {}, {}
    for name, value in state["model"].items():
        if not isinstance(value, torch.Tensor):
            continue
        key = _tensor_key(value)
        if key in first:
            tied[name] = first[key]
        else:
            first[key], tensors[name] = name, value.detach().cpu().contiguous()
    meta = {"format": "pt", "schema_version": str(SCHEMA_VERSION), "tied": json.dumps(tied),
            "config": json.dumps(state.get("config"), default=str), "spec": json.dumps(state.get("spec"), default=str)}
    tmp = temp_name(path)
    try:
        with open_new(tmp) as f:
            f.write(save(tensors, metadata=meta))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise CheckpointWriteError(f"could not write checkpoint weights {path}: {err.strerror or err}; the "
                                   f"checkpoint {path.with_suffix('.pt').name} beside it is complete") from None


def _regular_file(path: Path) -> None:
    """A checkpoint is a regular file (a link to one is followed): a FIFO or device would block or stream forever."""
    import stat
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # missing or unreadable: the reader names it
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):  # a directory: the reader's own message
        raise CheckpointError(f"checkpoint {path} is unreadable (not a regular file)")


def read_weights(path: str | Path) -> dict:
    """A step_XXXXXXXX.safetensors as a checkpoint state with only what a loader needs: {"schema_version", "model"
    (tied names restored), "config", "spec"}. Nothing is unpickled. Raises CheckpointError naming the file."""
    path = Path(path)
    _regular_file(path)
    try:
        from safetensors import safe_open
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            weights = {name: f.get_tensor(name) for name in f.keys()}
        tied = json.loads(meta.get("tied", "{}"))
        config, spec = json.loads(meta.get("config", "null")), json.loads(meta.get("spec", "null"))
    except ImportError:
        raise CheckpointError(f"checkpoint weights {path}: reading them needs the safetensors package "
                              f"(pip install 'longctx[hf]')") from None
    except Exception as err:  # noqa: BLE001 - safetensors raises its own errors (cut short, not a safetensors file)
        raise CheckpointError(f"checkpoint weights {path} are unreadable ({_why_unreadable(err)})") from None
    if not isinstance(tied, dict) or any(source not in weights for source in tied.values()):
        raise CheckpointError(f"checkpoint weights {path} are unreadable (its tied names {tied!r} name no tensor)")
    weights.update({alias: weights[source] for alias, source in tied.items()})
    return {"schema_version": SCHEMA_VERSION, "model": weights, "config": config, "spec": spec}


# ----- reading ----------------------------------------------------------------------------------------------

def load_checkpoint(path: str | Path) -> dict:
    """The raw dict of a checkpoint file: tensors and plain values only (weights_only), as stored."""
    with torch.serialization.safe_globals(_NUMPY_GLOBALS):
        return torch.load(path, map_location="cpu", weights_only=True)


def _why_unreadable(err: Exception) -> str:
    """One line: what made torch.load refuse or fail."""
    text = str(err)
    if text.startswith("Weights only load failed") or "Unsupported global: GLOBAL" in text:
        # weights_only refused an object: the file asked to rebuild (or call) something not allowed. torch names it
        # as "GLOBAL x" (a global, allowed or from a blocked module) or as a class it got, or not at all (an opcode)
        # only the builder refusals name a class the file asked for; "Can only append to lists, but got <class ...>"
        # and the like say the pickle's structure is broken (a damaged file)
        found = re.search(r"GLOBAL (\S+)|Can only (?:build|create new object)[^<]*but got <class '([^']+)'>", text)
        if found:
            held = next(g for g in found.groups() if g)
            return f"it holds {held}, not only tensors and plain values; not loaded, as that could run code"
        # nothing named (an opcode the safe loader refuses): a damaged file as likely as other objects
        return ("a pickle the weights-only loader refuses (a damaged file, or objects other than tensors and plain "
                "values); not loaded")
    if isinstance(err, IsADirectoryError) or (isinstance(err, OSError) and Path(err.filename or "").is_dir()):
        return "it is a directory, not a file"
    first = next((line.strip() for line in text.splitlines() if line.strip()), "").split(". ")[0]  # torch's advice
    return f"{type(err).__name__}: {first}" if first else type(err).__name__                      # follows


def upgrade(state: dict) -> dict:
    """A version-0 checkpoint in version 1's layout: the counters under `trainer`, RNG states as tensors."""
    state = dict(state)
    counters = {"step": 0, "tokens": 0, "elapsed": 0.0, "skipped_steps": 0, "wandb_id": None}
    trainer = {k: state.pop(k) for k in counters if k in state}
    if trainer:
        # written only right after an evaluation, which starts the training loss's window anew
        state["trainer"] = {**trainer, "train_loss_sum": 0.0, "train_loss_steps": 0}
    if isinstance(state.get("rng"), dict):
        ranks = state["rng"].get("per_rank", [state["rng"]])  # the oldest files hold one rank's states
        state["rng"] = {"per_rank": [plain_rng_state(r) for r in ranks]}
    state["schema_version"] = SCHEMA_VERSION
    return state


def read(path: str | Path, needs: Iterable[str] = ()) -> dict:
    """The checkpoint at `path` in today's schema. Raises CheckpointError naming the file when it cannot be read
    (cut short, a directory, objects other than tensors and plain values), is of a newer schema, or lacks one of
    the parts in `needs`."""
    path = Path(path)
    _regular_file(path)
    try:
        state = load_checkpoint(path)
    except Exception as err:  # torch.load raises RuntimeError, EOFError, UnpicklingError, OSError, ...
        raise CheckpointError(f"checkpoint {path} is unreadable ({_why_unreadable(err)})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} is unreadable (it holds a {type(state).__name__}, not a dict)")
    version = state.get("schema_version", 0)
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        raise NewerSchemaError(f"checkpoint {path} has schema version {version}, newer than this longctx's "
                               f"{SCHEMA_VERSION}: a newer longctx wrote it; use that version (this one neither "
                               f"reads it nor trains over it)")
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= SCHEMA_VERSION:
        raise CheckpointError(f"checkpoint {path} is unreadable (schema_version={version!r}; this longctx reads "
                              f"versions 0 to {SCHEMA_VERSION}: a newer longctx wrote it?)")
    if version == 0:
        state = upgrade(state)
    missing = [part for part in needs if not isinstance(state.get(part), dict)]
    if missing:
        raise CheckpointError(f"checkpoint {path} is unreadable (schema version {version} without "
                              f"{', '.join(missing)})")
    for key in ("config", "spec"):
        if not isinstance(state.get(key), (dict, type(None))):
            raise CheckpointError(f"checkpoint {path} is unreadable (its {key} is a {type(state[key]).__name__}, "
                                  f"not a mapping)")
    if "trainer" in needs:
        step = state["trainer"].get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise CheckpointError(f"checkpoint {path} is unreadable (its trainer state has no step count: "
                                  f"step={step!r})")
        named = _NAME.match(path.name)
        if named and int(named[1]) != step:   # a run's checkpoint is named by the step it holds
            raise CheckpointError(f"checkpoint {path} is unreadable (it holds step {step}, its name step "
                                  f"{int(named[1])}: edited or renamed)")
    return state


def weight_differences(expected: dict, found: dict) -> list[str]:
    """How the weights `found` (a checkpoint's model state) differ from `expected` (a model's state_dict): a line per
    tensor whose shape differs, that is missing, or that the model does not have."""
    ours = {k: tuple(v.shape) for k, v in expected.items()}
    theirs = {k: tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__ for k, v in found.items()}
    return ([f"{k}: {theirs[k]} -> {ours[k]}" for k in ours if k in theirs and ours[k] != theirs[k]]
            + [f"{k}: missing from the checkpoint" for k in ours if k not in theirs]
            + [f"{k}: not in this model" for k in theirs if k not in ours])


def first_non_finite(weights: dict) -> str | None:
    """The name of the first floating-point tensor of `weights` holding a NaN or an infinity (None: all finite)."""
    for name, value in weights.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
            return name
    return None


def read_newest(candidates: list[tuple[int, Path]], needs: Iterable[str] = (),
                warn: Callable[[str], None] | None = None) -> tuple[int, Path, dict]:
    """The newest readable of `candidates` ((step, path), oldest first, as list_checkpoints gives them) ->
    (step, path, state). Each one skipped for an older one is said once through `warn`, naming both. Raises
    CheckpointError when none is readable, naming the folder and why the oldest is not."""
    needs = tuple(needs)
    newest_first = list(reversed(candidates))
    for i, (step, path) in enumerate(newest_first):
        try:
            return step, path, read(path, needs)
        except NewerSchemaError:
            raise
        except CheckpointError as err:
            if i + 1 == len(newest_first):
                raise CheckpointError(f"none of the {len(candidates)} checkpoint(s) in {path.parent} is readable: "
                                      f"{err}") from None
            if warn is not None:
                warn(f"{err}; falling back to {newest_first[i + 1][1].name}")
    raise CheckpointError("no checkpoint to read")


class Checkpointer:
    """Collects the run's Stateful parts into one versioned checkpoint and gives each its own state back.

        checkpointer = Checkpointer(run_dir, keep, {"model": model, "optimizer": opt, ...}, meta=lambda: {...})
        state = checkpointer.state_dict()      # every rank (a part may gather across ranks)
        checkpointer.save(step, state)         # rank 0
        checkpointer.load_state_dict(read(path, PARTS))
    `meta()`: the plain values saved beside the parts (config, spec), read by loaders, restored by no part."""

    def __init__(self, run_dir: str | Path, keep: int, parts: dict[str, Stateful],
                 meta: Callable[[], dict] | None = None):
        self.run_dir, self.keep, self.parts, self.meta = Path(run_dir), keep, parts, meta

    def state_dict(self) -> dict:
        state = {"schema_version": SCHEMA_VERSION}
        state.update({name: part.state_dict() for name, part in self.parts.items()})
        state.update(self.meta() if self.meta else {})
        return state

    def load_state_dict(self, state: dict) -> None:
        for name, part in self.parts.items():
            part.load_state_dict(state[name])

    def save(self, step: int, state: dict) -> Path:
        return save_checkpoint(self.run_dir, step, state, self.keep)
