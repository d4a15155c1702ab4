"""How a run was made: `<run_dir>/provenance.json`, written by rank 0 when a run starts.

    {"command": [argv...], "overrides": [...], "git": {"commit", "dirty", "diff_file"}, "config_git": null or
     [{"dir", "commit", "dirty", "diff_file"} of each config folder outside the package's checkout (conf/ of another
     checkout, a --config-dir)],
     "versions": {"torch", "triton", "fla", "longctx", "python"}, "device": "...", "world_size": N, "time": "...",
     "config_file": "config.yaml" (the config the launch trained under: config.resume_step{N}.yaml on a resume),
     "launches": [the record of every launch, the first one included]}

The top level is the first launch (how the run was made); a resumed or requeued launch appends its own record to
`launches` and never rewrites the earlier ones. A launch from a dirty git tree leaves its `git diff HEAD` beside the
record (`provenance.diff`, then `provenance.launch<k>.diff`; `.config.diff`, `.config2.diff` ... for config folders
of other trees; untracked files under a config folder count, as new files). Anything that cannot be known (no git,
code outside a git tree, a package not installed) is null: recording provenance never stops a run.

    from longctx import provenance
    record = provenance.read("runs/RUN")            # None for runs older than the record
    print(provenance.format_command(record))        # the command that reruns it (same config)
"""
from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import platform
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from longctx.train.run_files import set_aside, write_atomic

FILE = "provenance.json"
CODE_DIR = Path(__file__).resolve().parent  # the installed longctx package: its git tree is the code that runs
# Distribution names of each version recorded (importlib.metadata: no import of the packages themselves).
DISTRIBUTIONS = {"torch": ("torch",), "triton": ("triton",), "fla": ("flash-linear-attention", "fla-core"),
                 "longctx": ("longctx",)}


def _version(names: tuple[str, ...]) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _git(*args: str, where: Path | None = None, raw: bool = False) -> str | bytes | None:
    """git's output in `where` (the package's folder by default; raw: bytes, as a diff of any encoding must stay),
    None where git fails or is missing."""
    try:
        out = subprocess.run(["git", "-C", str(where or CODE_DIR), *args], capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):  # no git, or it hung
        return None
    if out.returncode != 0:
        return None
    return out.stdout if raw else out.stdout.decode(errors="replace")


NULLS = {"commit": None, "dirty": None, "diff_file": None}   # a tree whose state cannot be known
UNTRACKED_MAX_BYTES = 1 << 20   # an untracked config file larger than this is named in the diff, not copied


def _untracked_diff(top: Path, folders: list[Path]) -> bytes:
    """New-file diffs of the untracked (not ignored) files under `folders` in the git tree at `top`, paths from `top`
    as `git diff HEAD` writes them: a config file never committed shapes a run as much as an edited one. An entry
    git cannot diff (a link to a folder, a nested repository, a file gone meanwhile, one over UNTRACKED_MAX_BYTES) is
    named on a line of its own."""
    names = _git("ls-files", "--others", "--exclude-standard", "-z", "--", *map(str, folders), where=top, raw=True)
    parts = []
    for name in filter(None, (names or b"").split(b"\0")):
        shown = name.decode(errors="replace")
        try:
            too_big = (top / os.fsdecode(name)).stat().st_size > UNTRACKED_MAX_BYTES
            out = None if too_big else subprocess.run(["git", "-C", str(top), "diff", "--no-index", "--",
                                                       "/dev/null", os.fsdecode(name)], capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            too_big, out = False, None
        if out is not None and out.returncode == 1 and out.stdout:   # exit status 1: the files differ
            parts.append(out.stdout)
        else:
            why = f"over {UNTRACKED_MAX_BYTES} bytes, " if too_big else ""
            parts.append(f"# untracked, {why}not copied: {shown}\n".encode())
    return b"".join(parts)


def _top(where: Path | None = None) -> Path | None:
    """The root of the git tree holding `where` (the package's folder by default), None outside one."""
    top = _git("rev-parse", "--show-toplevel", where=where)
    return Path(top.strip()).resolve() if top else None


def _tree_state(top: Path, config: list[Path] = ()) -> tuple[dict, bytes | None]:
    """({"commit", "dirty", "diff_file": None}, its diff or None when clean/unknown) of the git tree at `top`:
    tracked files against HEAD, and the untracked files under its config folders `config`."""
    commit = _git("rev-parse", "HEAD", where=top)
    if commit is None:
        return dict(NULLS), None
    diff = _git("diff", "HEAD", where=top, raw=True)   # the whole tree: conf/ and train.py shape a run too
    if diff is not None and config:
        diff += _untracked_diff(top, config)
    dirty = None if diff is None else bool(diff.strip())
    return {"commit": commit.strip(), "dirty": dirty, "diff_file": None}, diff if dirty else None


def config_dirs() -> list[Path]:
    """The folders this Hydra job composed its config from: the primary one (train.py's conf/) and any --config-dir
    (each once); none outside a Hydra job."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    folders = [Path(source.path) for source in HydraConfig.get().runtime.config_sources
               if source.schema == "file" and source.provider in ("main", "command-line")]
    return list(dict.fromkeys(folders))


def git_states(folders: list[Path]) -> tuple[dict, list[dict] | None, dict[str, bytes]]:
    """(the package's git tree, the trees of the config `folders` that are not the package's, their diffs by record
    key). The package's: nulls where it is not in a git tree of its own. Each other config folder: {"dir", "commit",
    "dirty", "diff_file": None} of the tree holding it (nulls outside one; a folder never committed there reads
    dirty, its files as new); None where every folder lies in the package's tree (a checkout of its own nested in
    the package's folder is another tree)."""
    ours = _git("ls-files", "--error-unmatch", Path(__file__).name) is not None   # else: not our tree's code
    top = _top() if ours else None
    tops = {folder: _top(folder) if folder.is_dir() else None for folder in folders}
    git, diff = _tree_state(top, [f for f in folders if tops[f] == top]) if top else (dict(NULLS), None)
    diffs = {"git": diff} if diff is not None else {}
    others = []
    for folder in (f for f in folders if top is None or tops[f] != top):
        state, diff = _tree_state(tops[folder], [folder]) if tops[folder] else (dict(NULLS), None)
        if diff is not None:
            diffs[f"config_git.{len(others)}"] = diff
        others.append({"dir": str(folder), **state})
    return git, others or None, diffs


def hydra_overrides() -> list[str] | None:
    """This job's command-line overrides (a sweep job's own values), None outside a Hydra job."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    return list(HydraConfig.get().overrides.task)


def collect(device: str | None = None, world_size: int = 1) -> dict:
    """This launch's record. `device`: the card's name (torch.cuda.get_device_name) or "cpu"; None asks torch."""
    return _collect(device, world_size)[0]


def _collect(device: str | None, world_size: int) -> tuple[dict, dict]:
    """(this launch's record, its diffs: {"git": the package tree's, "config_git.<i>": the i-th config folder's
    other tree's}, each present only when that tree is dirty)."""
    if device is None:
        import torch

        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    try:
        git, config_git, diffs = git_states(config_dirs())
    except Exception as err:   # recording provenance never stops a run: what it could not learn is null
        logging.getLogger("longctx").warning(f"provenance: the git state could not be read ({type(err).__name__}: "
                                             f"{err}); recorded as unknown")
        git, config_git, diffs = dict(NULLS), None, {}
    record = {
        "command": list(sys.argv), "overrides": hydra_overrides(), "git": git, "config_git": config_git,
        "versions": {**{key: _version(names) for key, names in DISTRIBUTIONS.items()},
                     "python": platform.python_version()},
        "device": device, "world_size": int(world_size),
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    return record, diffs


def read(run_dir: str | Path) -> dict | None:
    """The run's provenance record, or None for a run without one (older runs)."""
    path = Path(run_dir) / FILE
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not a provenance record (unreadable JSON: {type(err).__name__})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path}: not a provenance record (a JSON {type(record).__name__}, not an object)")
    return record


def write(run_dir: str | Path, device: str | None = None, world_size: int = 1, config_file: str | None = None) -> dict:
    """Record this launch in <run_dir>/provenance.json (appended to `launches` when the run already has one).
    config_file: the name of the config file the launch trains under (config.yaml, config.resume_step{N}.yaml ...):
    the report reads the newest launch's bounds from it. Returns the whole record."""
    run_dir = Path(run_dir)
    record, diffs = _collect(device, world_size)
    if config_file is not None:
        record["config_file"] = config_file
    try:
        earlier = read(run_dir)
    except (ValueError, OSError) as err:  # cut short or not a record: kept aside, never lost, never fatal
        # its diffs go with it (their names are free again for this record's); an earlier set-aside is kept too
        kept = set_aside([run_dir / FILE, *sorted(run_dir.glob("provenance*.diff"))], "unreadable", after_name=True)
        where = kept[0].name if kept else FILE
        logging.getLogger("longctx").warning(f"{err}; kept as {where}, a new record starts")
        earlier = None
    launches = earlier.get("launches", [earlier]) if earlier else []
    for key, diff in diffs.items():   # provenance.diff, provenance.config.diff, .config2.diff ..., then .launch<k>.
        field, _, index = key.partition(".")
        name = "provenance" + (f".launch{len(launches)}" if launches else "")
        name += f".config{int(index) + 1 if int(index) else ''}" if index else ""
        write_atomic(run_dir / f"{name}.diff", diff)
        (record[field][int(index)] if index else record[field])["diff_file"] = f"{name}.diff"
    whole = {k: v for k, v in earlier.items() if k != "launches"} if earlier else dict(record)
    whole["launches"] = [*launches, record]
    write_atomic(run_dir / FILE, json.dumps(whole, indent=1) + "\n")
    return whole


def command_line(record: dict, python: str = "python") -> list[str]:
    """The command that makes this run again: the entry point and this job's overrides (a sweep's job gets its
    own values, not the sweep's `-m a=1,2`). Records without Hydra overrides replay their argv. A launch of several
    processes starts as `torchrun --nproc_per_node=N` on one machine (the world size a context-parallel run's config
    needs; across nodes, give torchrun the same N in all)."""
    argv = record["command"]
    world = int(record.get("world_size") or 1)
    start = [python] if world == 1 else ["torchrun", f"--nproc_per_node={world}"]
    if record.get("overrides") is None:
        return [*start, *argv]
    # A Slurm job's argv is submitit's runner, not the script the sweep was launched with
    script = argv[0] if argv and argv[0].endswith(".py") and "submitit" not in argv[0] else "train.py"
    return [*start, script, *record["overrides"]]


def format_command(record: dict) -> str:
    """command_line as one line a shell takes back."""
    return shlex.join(command_line(record))


def diff_digest(diff: bytes | None) -> str | None:
    """A short digest of an uncommitted diff (None for none): equal digests, equal edits."""
    return None if diff is None else hashlib.sha256(diff).hexdigest()[:16]


def code_now() -> dict:
    """This process's code, as an evaluation's result records it: the package tree's commit, whether it is dirty and
    a digest of its uncommitted diff, and longctx's version."""
    record, diffs = _collect("cpu", 1)
    return {"commit": record["git"].get("commit"), "dirty": record["git"].get("dirty"),
            "diff_sha256": diff_digest(diffs.get("git")), "longctx": record["versions"].get("longctx")}


def differences_from_now(record: dict | None, run_dir: str | Path | None = None) -> dict[str, tuple]:
    """{key: (then, now)} for the package versions and git commit of the run's latest launch that differ from this
    process's, and its uncommitted edits (git.diff: a digest of each side's diff, 'none' for a clean tree; with
    `run_dir`, where the launch's diff file lies): what evaluating or reporting a run today may owe to code it was not
    trained with. Empty for a record that is missing (older runs) or the same."""
    if not record:
        return {}
    then = (record.get("launches") or [record])[-1]
    now, diffs = _collect("cpu", 1)
    pairs = {f"versions.{k}": (then.get("versions", {}).get(k), v) for k, v in now["versions"].items()}
    then_git = then.get("git") or {}
    pairs["git.commit"] = (then_git.get("commit"), now["git"]["commit"])
    if run_dir is not None and then_git.get("dirty") is not None and now["git"].get("dirty") is not None:
        diff_file = Path(run_dir) / str(then_git.get("diff_file") or "")
        if not then_git["dirty"]:
            then_diff = "none"
        elif then_git.get("diff_file") and diff_file.is_file():
            then_diff = diff_digest(diff_file.read_bytes())
        else:
            then_diff = None    # a dirty launch whose diff is gone: not compared
        pairs["git.diff"] = (then_diff, diff_digest(diffs.get("git")) or "none")
    return {k: (a, b) for k, (a, b) in pairs.items() if a != b and a is not None and b is not None}
