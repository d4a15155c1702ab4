"""Checks train.py makes before Hydra writes anything: a Hydra callback (conf/config.yaml, hydra.callbacks) that runs
before Hydra makes the run folder (a plain run) or the sweep folder and its multirun.yaml (a multirun), and the check
of a config that `--cfg` only prints. A failed check is one line on stderr and exit code 2.

- a run: run_name stays inside runs/; the run folder is not a file and can be written;
- a multirun: the same of the sweep folder; a sweep folder that already holds a sweep (multirun.yaml) is relaunched
  only with the same overrides but for the values of its sweep axes (which resumes or adds jobs, each in the folder
  its run name gives); a Slurm launcher needs Slurm (sbatch on PATH).
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from longctx.train.run_dir import check_run_name, check_writable_dir

SLURM_LAUNCHERS = ("SlurmLauncher",)  # hydra-submitit's submitit_slurm (submitit_local runs here)


def fail(message: str):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


class LaunchChecks(Callback):
    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        try:
            check_run_name(config.run_name)
            check_writable_dir(Path(str(config.hydra.run.dir)), "hydra.run.dir")
        except ValueError as err:
            fail(str(err))

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        sweep = Path(str(config.hydra.sweep.dir))
        try:
            check_run_name(config.run_name)
            check_writable_dir(sweep, "hydra.sweep.dir")
            check_sweep_reuse(sweep, list(config.hydra.overrides.task))
            check_slurm(config)
        except ValueError as err:
            fail(str(err))


def _by_key(overrides: list[str]) -> dict[str, str]:
    return {o.split("=", 1)[0].lstrip("+~"): o for o in overrides}


def _swept(override: str) -> bool:
    """A sweep axis (`seed=0,1,2`, `range(...)`, `choice(...)`): its values name jobs, each in its own folder."""
    value = override.split("=", 1)[1] if "=" in override else ""
    return "," in value.replace("\\,", "") or value.startswith(("range(", "choice(", "glob("))


def check_sweep_reuse(sweep: Path, overrides: list[str]) -> None:
    """A sweep folder holds one sweep. Its jobs' folders are named by what they run, so a relaunch that sweeps the
    same axes over other values (a subset to resume, new seeds) adds or resumes jobs and never mixes two runs in one
    folder; any other difference (a key set to another value, added or dropped) is refused, naming it. The earlier
    launch's multirun.yaml is kept as multirun.launch<N>.yaml before Hydra writes the new one."""
    record = sweep / "multirun.yaml"
    if not record.exists():
        return
    try:
        saved = OmegaConf.load(record).hydra.overrides.task  # OmegaConf.load reads YAML safely (no code runs)
        saved = [str(o) for o in saved]
    except Exception as err:  # unreadable or not a Hydra record: refuse rather than overwrite it
        raise ValueError(f"hydra.sweep.dir={str(sweep)!r}: its multirun.yaml is unreadable ({type(err).__name__}); "
                         f"pick a new hydra.sweep.dir") from None
    old, new = _by_key(saved), _by_key(overrides)
    diff = [f"{old[k]} -> {new[k]}" for k in new
            if k in old and old[k] != new[k] and not (_swept(old[k]) or _swept(new[k]))]
    diff += [f"{new[k]} (new)" for k in new if k not in old]
    diff += [f"{old[k]} (dropped)" for k in old if k not in new]
    if diff:
        raise ValueError(f"hydra.sweep.dir={str(sweep)!r} already holds a sweep launched with other overrides "
                         f"({'; '.join(diff)}); relaunch it with its own overrides (see its multirun.yaml) to resume "
                         f"it, or pick a new hydra.sweep.dir. Nothing was written.")
    if saved != list(overrides):  # other values of the same axes: keep the earlier launch's record
        n = 1 + sum(1 for _ in sweep.glob("multirun.launch*.yaml"))
        record.replace(sweep / f"multirun.launch{n}.yaml")


def check_slurm(config: DictConfig) -> None:
    target = str(OmegaConf.select(config, "hydra.launcher._target_", default="") or "")
    if target.endswith(SLURM_LAUNCHERS) and shutil.which("sbatch") is None:
        raise ValueError("hydra/launcher=submitit_slurm: no Slurm here (sbatch is not on PATH); launch from a Slurm "
                         "login node, or drop hydra/launcher to run the sweep on this machine")


def check_shown_config(argv: list[str], conf_dir: Path) -> None:
    """`python train.py --cfg job ...` prints the config without running anything: check it first, as a run would
    (keys, types, values), so a bad value is named instead of printed."""
    from hydra._internal.utils import get_args_parser

    try:
        args = get_args_parser().parse_args(argv)
    except SystemExit:
        return  # Hydra's own parser reports it
    if not args.cfg or args.multirun or args.help or args.hydra_help:
        return
    from hydra import compose, initialize_config_dir

    from longctx.train.config import validate

    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            cfg = compose("config", overrides=list(args.overrides), return_hydra_config=True)
    except Exception:
        return  # a composition error: Hydra reports it as it prints
    choices = {g: o for g, o in cfg.hydra.runtime.choices.items() if "/" not in g}
    OmegaConf.set_struct(cfg, False)
    cfg.pop("hydra")
    try:
        validate(cfg, choices)
    except ValueError as err:
        fail(str(err))
