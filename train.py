"""Train a long-context language model.

    python train.py                                        # tiny GPT-2, bundled ICL Markov data, CPU
    python train.py attention=power p=2 ctx=512
    python train.py arch=rwkv7 attention=power p=2 ctx=65536 model=small data=longcrawl64 data.path=/data/lc64

Every key of conf/ can be overridden on the command line; `python train.py --help` lists the main ones.
"""
import os
import signal
import sys
from pathlib import Path


def interrupted_while_starting(kind, value, traceback) -> None:
    """sys.excepthook of a launch: Ctrl-C before the training steps catch it (an import, the checks) is one line, not
    a traceback through whatever was loading; anything else prints as usual."""
    if issubclass(kind, KeyboardInterrupt):
        print("interrupted by Ctrl-C while starting, before the first training step; relaunch the same command to "
              "start it", file=sys.stderr)
    else:
        sys.__excepthook__(kind, value, traceback)


if __name__ == "__main__":
    sys.excepthook = interrupted_while_starting

# Triton keeps autotuning winners on disk (FLA benchmarks its kernels' configs on first use, ~90 s per shape on
# an H100), so a second run on the same machine and shapes starts at once; TRITON_CACHE_AUTOTUNING=0 turns it off
os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from hydra.types import RunMode  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

import longctx  # noqa: E402,F401  (registers ${longctx.run_name:}; torch and the trainer load in main: --help is fast)

USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from longctx.train.checkpoint import CheckpointWriteError
    from longctx.train.config import resolve_resume
    from longctx.train.stages import StagedRun, StageError
    from longctx.train.stop import ABORT_LINE, AbortRequested, StopRequested
    from longctx.train.trainer import Trainer

    hydra_cfg = HydraConfig.get()
    choices = {group: option for group, option in hydra_cfg.runtime.choices.items() if "/" not in group}
    cfg.trainer.resume = resolve_resume(cfg.trainer.resume, multirun=hydra_cfg.mode == RunMode.MULTIRUN)
    sweep = hydra_cfg.sweeper.get("params") or {}
    if hydra_cfg.mode != RunMode.MULTIRUN and sweep:  # an experiment that is a grid, launched without -m: one point
        print(f"note: experiment={choices.get('experiment')} sweeps {', '.join(sweep)} (hydra.sweeper.params); "
              f"without -m this trains one point, its defaults: add -m to run the grid", file=sys.stderr)
    try:
        # every check of the config, data and checkpoint happens here; trainer.stages: every stage's config too
        trainer = (StagedRun if cfg.trainer.get("stages") else Trainer)(cfg, choices)
    except USER_ERRORS as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        remove_unused_runs_folder(hydra_cfg.runtime.output_dir, None)  # nothing was written: none of it is used
        print(f"error: {err}", file=sys.stderr)  # bad input: one clear line naming the field, no traceback
        sys.exit(2)
    remove_unused_runs_folder(hydra_cfg.runtime.output_dir, cfg.run_dir)
    try:
        trainer.fit()
    except StageError as err:  # a later stage's own checks (trainer.stages): bad input, one line
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except (CheckpointWriteError, FloatingPointError) as err:  # a full disk, a non-finite loss: one line, no traceback
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    except StopRequested as stopped:  # SIGTERM / SIGUSR1 / Ctrl-C: the last step is checkpointed (the trainer said so
        sys.exit(128 + stopped.signum)  # and how to continue, on stdout and in train.log); exit as the signal would
    except AbortRequested:  # a second Ctrl-C: aborted mid-step, one line
        print(ABORT_LINE, file=sys.stderr)
        sys.exit(128 + signal.SIGINT)
    except KeyboardInterrupt:  # Ctrl-C outside the training steps (a stage being built, a probe, the last save)
        print("interrupted by Ctrl-C outside the training steps; relaunch with trainer.resume=true to continue from "
              "the newest checkpoint, if any", file=sys.stderr)
        sys.exit(128 + signal.SIGINT)


def remove_unused_runs_folder(output_dir: str, run_dir: str | None) -> None:
    """run_dir=X given (or a launch refused): Hydra's own output folder, runs/<name>, and a `runs/` left empty by
    it, are removed when empty; never through a link (a `runs` linked elsewhere is the user's)."""
    unused = Path(output_dir).absolute()
    if run_dir is not None and unused == Path(run_dir).absolute():
        return
    if not unused.is_symlink():
        remove_if_empty(str(unused))
    if unused.parent.name == "runs" and not unused.parent.is_symlink():
        remove_if_empty(str(unused.parent))


def remove_if_empty(run_dir: str) -> None:
    """Hydra creates the run directory before the checks run; a launch that fails them leaves nothing."""
    try:
        os.rmdir(run_dir)  # only ever removes an empty folder
    except OSError:
        pass


if __name__ == "__main__":
    from longctx.train.launch import check_command_line

    # a mistyped key or option, a bad value that --cfg would only print: one line, exit 2, before Hydra writes
    sys.argv[1:] = check_command_line(sys.argv[1:], Path(__file__).resolve().parent / "conf")
    try:
        main()
    except BrokenPipeError:  # `python train.py --help | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
