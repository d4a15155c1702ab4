"""The training loop. Components are built in dependency order (torchtitan's habit):
config -> distributed -> data description -> model -> optimizer -> scheduler -> data readers -> checkpoint
-> loggers -> loop. Each stateful piece has state_dict()/load_state_dict(); the checkpoint collects them.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import io
import json
import math
import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from longctx.data.identity import IDENTITY_FILE, data_identity, read_identity
from longctx.data.mqar import IGNORE
from longctx.data.tokenizer import TOKENIZER_FILE, tokenizer_file_of
from longctx.eval.records import RECORD_DIR, loss_digest
from longctx.eval import (HeldoutEvaluation, autocast, doc_record, eval_line, step_record_path,
                          write_doc_record)
from longctx.models import ModelSpec, build_model
from longctx.models.spec import SPEC_KEYS, model_spec, model_vocab_size
from longctx import provenance
from longctx.train import checkpoint as ckpt
from longctx.train.config import check_context_parallel, validate
from longctx.train.console import (close_logging, eta, format_duration, is_terminal, log, log_to_file, progress_bar,
                                   setup_logging)
from longctx.train.estimate import assumed_rate, check_fits
from longctx.train.data import (ContextSlices, build_heldout, build_train_reader, check_generated_data, epoch_tokens,
                                 resolve_splits, trains_on_queries)
from longctx.train.flops import budget_reached, budget_steps, flops_report, format_ratio, mfu
from longctx.train.loggers import check_wandb
from longctx.models.context_parallel import ContextParallelModel, set_context_parallel
from longctx.train.distributed import (DistInfo, all_reduce_sum, barrier, context_parallel_layout, init_distributed,
                                       shutdown)
from longctx.train.loggers import JsonlLogger, WandbLogger, plot_icl_curves, read_wandb_id, wandb_id_for
from longctx.train.paths import resolve_run_paths
from longctx.train.optim import (WARMUP_FRACTION, Schedule, apply_hyperparameters, build_optimizer, build_scheduler,
                                  saved_schedule)
from longctx.train.resume import classify, config_changes, format_changes, refusal
from longctx.train.rng import RNGState, seed_everything
from longctx.train.run_dir import RunLock
from longctx.train.run_files import check_entry_kinds, check_no_links, launched_before, set_aside, write_atomic
from longctx.train.stop import StopRequested, StopSignals, resume_command
from longctx.train.stop_when import parse_stop_when


INLINE_CURVE_MAX = 8192  # longer per-position curves go to <run_dir>/per_position_loss/step_*.npy
DATA_WAIT_WARN = 0.1     # waiting for the reader this share of the training time is said on the console
MEASURED_STEPS = 3       # after this launch's first steps its step time is measured and said (the first one, with its
                         # warm-up, is left out of the measure)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("config: device='cuda' but no CUDA device is available")
    return torch.device(name)


def check_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """ValueError when a loaded optimizer's per-parameter tensors (AdamW's moments) do not have their parameter's
    shape: load_state_dict takes them as they are, and the first step would fail on them."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            for key, value in optimizer.state.get(param, {}).items():
                if isinstance(value, torch.Tensor) and value.ndim > 0 and value.shape != param.shape:
                    raise ValueError(f"a parameter's {key} has shape {tuple(value.shape)}, its parameter "
                                     f"{tuple(param.shape)}")


def prior_training(checkpoint: Path, step: int | None) -> tuple[int, float]:
    """(tokens, FLOPs) the weights of `checkpoint` were trained on, every stage before included: its run's
    metrics.jsonl record at the checkpoint's step (its tokens_all_stages, or its tokens where it predates them);
    (0, 0.0) when the run keeps no such record (a bare checkpoint file: the counts then start at this run)."""
    run_dir = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent
    try:
        records = [r for r in JsonlLogger(run_dir).records() if step is None or r["step"] <= step]
    except (OSError, ValueError):
        records = []
    if not records:
        return 0, 0.0
    last = records[-1]
    return (int(last.get("tokens_all_stages", last.get("tokens", 0))),
            float(last.get("flops_all_stages", last.get("flops", 0.0))))


def is_hf_folder(source) -> bool:
    """Whether trainer.init_from names a Hugging Face checkpoint folder (config.json; a run folder holds config.yaml).
    Decided here: importing longctx.hf loads transformers, which only runs from such a folder need."""
    path = Path(str(source)).expanduser()
    return path.is_dir() and (path / "config.json").is_file()


def model_vocab(cfg: DictConfig, depth: int = 0):
    """The model's vocabulary as a function of the data's: padded to a multiple of 64 (model_vocab_size), or a
    Hugging Face checkpoint's own when the run starts from one (trainer.init_from), directly or through the runs
    that started from it (a later stage, a run from such a run's weights; their config.yaml name their source). A
    resumed run decides the same way, so that its model is the one its checkpoints hold."""
    source = cfg.trainer.get("init_from") if "trainer" in cfg else None
    if not source:
        return model_vocab_size
    if is_hf_folder(source):
        try:
            from longctx.hf.import_weights import checkpoint_vocab
        except ImportError as err:   # the hf extra missing: one line naming the key, not a traceback
            raise ValueError(f"trainer.init_from={source}: a Hugging Face folder; {err}") from None
        return lambda vocab: checkpoint_vocab(source, vocab)
    path = Path(str(source)).expanduser()
    run_dir = path if path.is_dir() else path.parent.parent if path.parent.name == "checkpoints" else path.parent
    import yaml

    try:
        parent = OmegaConf.load(run_dir / "config.yaml")
    except (OSError, ValueError, yaml.YAMLError):  # no readable config there: the source's checks name the problem
        return model_vocab_size
    return model_vocab(parent, depth + 1) if depth < 64 else model_vocab_size  # 64: a chain that loops


def compile_model(model: torch.nn.Module, how) -> torch.nn.Module:
    """trainer.compile: false (eager), blocks or true (each residual block compiled in place: one graph, traced once and
    reused by every layer, in seconds; the weights keep their names), or model (torch.compile of the whole model,
    returned as a wrapper). The power kernels run as custom ops either way, so the attention does not split a graph."""
    if how is True or how == "blocks":
        for block in model.residual_blocks:
            block.compile()
        return model
    return torch.compile(model) if how == "model" else model


# The trainer's own counters, a Stateful part of every checkpoint (values: a fresh run's)
# train_loss_sum/_steps: the training loss since the last evaluation (its record's train_loss), kept in the
# checkpoint so that a run stopped between evaluations (train.stop) logs the same train_loss as an uninterrupted one
# prior_tokens/_flops: what the runs this one's weights came from (trainer.init_from, every stage before) trained
COUNTERS = {"step": 0, "tokens": 0, "elapsed": 0.0, "skipped_steps": 0, "wandb_id": None, "train_loss_sum": 0.0,
            "train_loss_steps": 0, "prior_tokens": 0, "prior_flops": 0.0}
# What a launch stopped before its first checkpoint wrote that describes its run, set aside when the folder starts
# over (Trainer._start_over); train.log and provenance.json go on below it, as on a resume
START_OVER_ASIDE = ("metrics.jsonl", RECORD_DIR, "icl_curves.png", "config.yaml", IDENTITY_FILE, TOKENIZER_FILE,
                    "wandb_id")
# ModelSpec fields that change how the model runs, not what it is: a resumed run may change them.
RUNTIME_SPEC_FIELDS = ("chunk_size", "checkpoint_activations")


def starts_over(run_dir: str | Path) -> bool:
    """Whether a launch in `run_dir` starts its run over (check_run_dir without trainer.resume=true): an earlier
    launch got past its checks but saved no checkpoint, no weights, and at most one evaluation (more: its
    checkpoints were removed, and the folder is refused instead)."""
    try:
        return check_run_dir(Path(run_dir), "auto")[1]
    except FileExistsError:
        return False


def check_run_dir(run_dir: Path, resume) -> tuple[list[Path], bool, int]:
    """Never overwrite a run that saved a checkpoint: continue it only when asked (trainer.resume: True, False or
    "auto"). A folder holding none (its launch stopped before the first) is started over, unless resume=True asked to
    continue a run. Returns (the folder's checkpoints, newest first; whether the launch starts an earlier one over;
    the evaluations that launch logged)."""
    found = ckpt.list_checkpoints(run_dir)
    latest = found[-1] if found else None
    if resume is True and latest is None:
        raise FileNotFoundError(f"trainer.resume=true but {run_dir} holds no checkpoint "
                                f"(looked in {ckpt.checkpoint_dir(run_dir)})")
    if resume is False and latest is not None:
        raise FileExistsError(
            f"{run_dir} already holds a run (checkpoint: {latest[1].name}); start another in a new folder "
            f"(run_name=<new name>, or another run_dir / hydra.run.dir where one is given), or pass "
            f"trainer.resume=true (or auto) to continue this one. Nothing was overwritten.")
    weights = ckpt.list_weights(run_dir)
    if latest is None and weights:  # a run shared as its weights, or one whose .pt files were removed
        raise FileExistsError(
            f"{run_dir} holds a run's weights ({weights[-1][1].name}) but no checkpoint to continue from; "
            f"start another in a new folder (run_name=<new name>, or another run_dir / hydra.run.dir where one is "
            f"given; trainer.init_from={run_dir} starts one from its weights). Nothing was overwritten.")
    restart = latest is None and launched_before(run_dir)
    logged = JsonlLogger(run_dir).count_records() if restart else 0
    if logged > 1:  # every evaluation is followed by a checkpoint: these were removed, not never written
        raise FileExistsError(
            f"{run_dir} holds {logged} evaluations but no checkpoint (removed?): nothing to continue from, "
            f"and a run that trained this far is not started over; start another in a new folder (run_name=<new "
            f"name>, or another run_dir / hydra.run.dir where one is given). Nothing was overwritten.")
    return [path for _, path in reversed(found)], restart, logged


def _repoint_records(moved: list[Path]) -> None:
    """After a start-over's set-aside: the kept metrics' per-document record paths (`"doc_bins": "eval/..."`) name
    the kept records folder (`eval.before_restart[k]/...`, whether or not it was there to move), never the new run's
    `eval/`, which reuses their names. Only those strings change; every other byte of the kept file stays."""
    metrics = next((p for p in moved if p.name.startswith("metrics.") and p.suffix == ".jsonl"), None)
    if metrics is None:
        return
    kept = f"{RECORD_DIR}.{metrics.name[len('metrics.'):-len('.jsonl')]}"   # set_aside's one number for all
    lines, changed = metrics.read_bytes().split(b"\n"), False
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
        except ValueError:                 # malformed or not UTF-8: kept as it is
            continue
        name = row.get("doc_bins") if isinstance(row, dict) else None
        old = b'"doc_bins": ' + json.dumps(name).encode()   # as JsonlLogger writes it
        if isinstance(name, str) and name.startswith(RECORD_DIR + "/") and line.count(old) == 1:
            lines[i] = line.replace(old, b'"doc_bins": ' + json.dumps(kept + name[len(RECORD_DIR):]).encode())
            changed = True
    if changed:
        write_atomic(metrics, b"\n".join(lines))


def whole_context_window(cfg) -> str | None:
    """A sliding window at least as long as the context masks nothing: the run is softmax attention under the name
    window (a sweep's short contexts). Said once at the start, so that its curves are not read as a window's."""
    att = cfg.attention
    if att.get("name") == "window" and int(att.window) >= int(cfg.ctx):
        return (f"attention.window={att.window} >= ctx={cfg.ctx}: every position sees its whole context, so this run "
                f"is softmax attention (attention=exp) named {att.tag}; a window below ctx restricts it")
    return None


class Trainer:
    def __init__(self, cfg: DictConfig, choices: dict | None = None):
        """Check everything (config, data, checkpoint) before the run directory is written to.
        `choices`: Hydra's group -> chosen option, so config keys are checked against the chosen files."""
        self.lock = None
        try:
            self._build(cfg, choices)
        except BaseException:
            close_logging()  # a run that fails its checks leaves the process's logging as it found it
            self._release(undo=True)
            raise

    def _build(self, cfg: DictConfig, choices: dict | None) -> None:
        validate(cfg, choices, for_run=True)
        self.cfg = resolve_run_paths(cfg)  # recorded absolute: the run works from any folder
        if cfg.trainer.num_threads:
            torch.set_num_threads(cfg.trainer.num_threads)
        self.device = pick_device(cfg.device)
        if self.device.type == "cpu":
            # Flush denormals to zero: tiny activations/gradients of small models otherwise fall into x86's
            # slow denormal path (measured: the default 3-layer run went from 84 to 690-790 ms per step).
            torch.set_flush_denormal(True)
        self.dist: DistInfo = init_distributed(self.device.type)
        setup_logging(self.dist.is_main)
        if self.device.type == "cuda":
            self.device = torch.device("cuda", self.dist.local_rank)
        self.run_dir = Path(cfg.run_dir)
        check_context_parallel(cfg, self.dist.world_size)  # N | world, DP ranks | the batch
        self.layout = context_parallel_layout(self.dist, cfg.trainer.get("context_parallel", 1))
        check_generated_data(cfg.data, cfg.ctx)  # a bad data value named before "the folder holds a run"
        self._lock_run_dir()
        check_no_links(self.run_dir)
        check_entry_kinds(self.run_dir)
        candidates = self._check_run_dir()
        metrics = JsonlLogger(self.run_dir)
        if not self.restart:  # a start-over sets both files aside as they are: nothing of them is read
            metrics.records()  # a line that is not a record: named now, before anything is written
        check_wandb(cfg.logger)
        if cfg.logger.wandb.mode != "disabled" and not self.restart:
            read_wandb_id(self.run_dir)  # a stored id wandb would refuse: named now, not as wandb's traceback
        vocab_of = model_vocab(cfg)
        rate = assumed_rate(self.device, self.dist.world_size)   # a CPU's measured once, for both of a resume's

        def fits(say: bool, done: int, available: float | None = None):
            return check_fits(cfg, self.device, lambda vocab: model_spec(cfg, vocab_of(vocab)), self.dist.world_size,
                              done_steps=done, say=say, rate=rate, available=available)
        # before any data is generated or read; a resume says it once its checkpoint takes this config (after _load:
        # a refused resume is its one error line), counting the steps after the checkpoint it resumed from
        self.estimate = fits(not candidates, ckpt.step_of(candidates[0]) if candidates else 0)
        seed_everything(cfg.seed)

        # Data description first: the model's vocabulary comes from it. Rank 0 generates the default
        # dataset if needed; the others wait for it.
        if self.dist.is_main:
            self.splits = resolve_splits(cfg.data, cfg.ctx)
        barrier(self.dist)
        if not self.dist.is_main:
            self.splits = resolve_splits(cfg.data, cfg.ctx)
        self.spec: ModelSpec = model_spec(cfg, vocab_of(self.splits.info["vocab_size"]))

        self.model = set_context_parallel(build_model(self.spec).to(self.device), self.layout.cp)
        bf16 = cfg.trainer.precision == "bf16" or (cfg.trainer.precision == "auto" and self.device.type == "cuda")
        # the training sequences' length: data.reshape_block cuts each document into rows of that many tokens
        train_len = cfg.data.get("reshape_block") or cfg.ctx
        self.flops = flops_report(self.model, train_len, self.device.type, torch.bfloat16 if bf16 else torch.float32)
        self.device_name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        if self.dist.is_main and (note := whole_context_window(cfg)):
            log.warning(note)
        self.optimizer = build_optimizer(self.model, cfg.optim)
        self.schedule = self._planned_schedule(say=not candidates)    # a resume's own note says its schedule
        self.scheduler = build_scheduler(self.optimizer, self.schedule)
        self.train_model = compile_model(self.model, cfg.trainer.compile)
        if self.dist.enabled:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.train_model = torch.nn.parallel.DistributedDataParallel(self.train_model, device_ids=ids)

        # the DP rank's documents; with CP, each rank of its CP group keeps its slice of their context
        self.loss_on_queries = trains_on_queries(cfg.data)
        self.reader = build_train_reader(self.splits, cfg.data, cfg.ctx, self.layout.dp_rank, self.layout.dp_world,
                                         self.spec.vocab_size)
        self.train_tokens = epoch_tokens(self.reader, cfg.data.docs_per_batch, cfg.ctx)  # one pass, as read
        if self.layout.cp is not None:
            self.reader = ContextSlices(self.reader, self.layout.cp.rank, self.layout.cp.world)
        self.heldout = build_heldout(self.splits, cfg.data, cfg.ctx, self.spec.vocab_size)
        self.evaluation = HeldoutEvaluation(self.heldout, cfg.trainer.icl_bins)  # refuses bins too narrow to trust

        self.step, self.tokens, self.elapsed = 0, 0, 0.0
        self.train_loss_sum, self.train_loss_steps = 0.0, 0
        self.prior_tokens, self.prior_flops, self.said_epochs = 0, 0.0, False
        self.skipped_steps, self.consecutive_skips = 0, 0
        self.warned_data_wait = False
        self.wandb_id = None
        self.checkpointer = ckpt.Checkpointer(
            self.run_dir, cfg.trainer.keep_checkpoints,
            {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler, "data": self.reader,
             "rng": RNGState(self.dist, note=log.info if self.dist.is_main else None),
             "trainer": ckpt.Attributes(self, COUNTERS)},
            meta=lambda: {"config": OmegaConf.to_container(self.cfg, resolve=True), "spec": dict(self.spec.__dict__)})
        if candidates:
            self._load(candidates)  # a changed config key is named first, then changed data of unchanged keys
            # the memory measured before the data and model were loaded, as the first estimate's
            self.estimate = fits(True, self.step, self.estimate.available_bytes)
        elif cfg.trainer.get("init_from"):
            self._init_weights(cfg.trainer.init_from)
        # a run started over records the data of this launch (the stopped one's record is set aside)
        self.new_identity = (data_identity(self.splits.train_path, self.splits.heldout_path) if self.restart
                             else self._check_data_identity(bool(candidates)))
        # A relaunched finished run (a requeued sweep job, a resubmitted script) has nothing to do
        self.stop_when = parse_stop_when(cfg.trainer.get("stop_when"))
        earlier = [] if self.restart else metrics.records()   # a start-over's are set aside unread
        self.complete = self.step >= cfg.trainer.max_steps or self._out_of_budget() or self._stop_met(earlier)

        # Every check passed: from here on the run directory is written to
        self.jsonl = metrics if self.dist.is_main else None
        self.wandb = None
        if self.dist.is_main and not self.complete:
            ckpt.remove_stale_temps(self.run_dir)  # left by a process killed mid-write
            if candidates:
                self._set_aside_unreadable(self.step)  # newer checkpoints that could not be read
            if self.restart:
                self._start_over()  # before this launch's config and data record are written
            if self.new_identity is not None:
                write_atomic(self.run_dir / IDENTITY_FILE, json.dumps(self.new_identity, indent=1) + "\n")
            config_file = self._write_config()
            self._keep_tokenizer()
            provenance.write(self.run_dir, self.device_name, self.dist.world_size, config_file=config_file.name)
            log_to_file(self.run_dir)
            if candidates:  # evaluations after the checkpoint are redone; the ones dropped are kept aside
                kept = self.jsonl.truncate_after(self.step)
                if kept is not None:
                    log.info(f"the evaluations after step {self.step} are redone from its checkpoint; the earlier "
                             f"ones are kept in {kept}")
            if cfg.logger.wandb.mode != "disabled":
                self.wandb_id = wandb_id_for(self.run_dir, self.wandb_id)
                self.wandb = WandbLogger(cfg.logger, self.run_dir, OmegaConf.to_container(cfg, resolve=True),
                                         cfg.run_name, self.wandb_id)

    # ----- run directory, config, checkpoints -------------------------------------------------------------
    def _lock_run_dir(self) -> None:
        """One process per run folder (run_dir.RunLock), taken before the folder is looked at; rank 0 holds it and
        every rank learns whether it got it."""
        error = None
        if self.dist.is_main:
            self.lock = RunLock(self.run_dir)
            try:
                self.lock.acquire()
            except ValueError as err:
                self.lock, error = None, err
        if self.dist.enabled:
            flag = torch.tensor(float(error is not None), device=self.device)
            if all_reduce_sum(flag, self.dist).item() > 0 and error is None:
                error = ValueError(f"run_dir={str(self.run_dir)!r}: rank 0 could not lock it (its error says why)")
        if error is not None:
            raise error

    def close(self) -> None:
        """Let go of the run folder (fit() does so at its end): for code that builds a Trainer and never fits it."""
        self._release()

    def _release(self, undo: bool = False) -> None:
        if self.lock is not None:
            self.lock.release(undo=undo)
            self.lock = None

    def _planned_schedule(self, say: bool = True) -> Schedule:
        """The schedule of this launch's config: the cosine ends at trainer.max_steps, or at the step
        trainer.flops_budget stops the run when that comes first (say: a warmup longer than the run is said)."""
        cfg = self.cfg
        end = cfg.trainer.max_steps
        budget_steps = self._budget_steps()
        if budget_steps is not None and budget_steps < end:
            end = budget_steps
        schedule = Schedule.from_config(cfg.optim, end)
        if schedule.warmup_steps != cfg.optim.warmup_steps and self.dist.is_main and say:
            stops = "trainer.max_steps" if end == cfg.trainer.max_steps else "trainer.flops_budget"
            steps = f"{schedule.warmup_steps} step{'s' * (schedule.warmup_steps != 1)}"
            log.info(f"optim.warmup_steps={cfg.optim.warmup_steps} is longer than the run ({end} steps, {stops}): "
                     f"warming up over {steps} instead ({WARMUP_FRACTION:.0%} of it)")
        return schedule

    def _tokens_per_step(self) -> int:
        return self.cfg.data.docs_per_batch * self.cfg.ctx

    def _budget_steps(self) -> int | None:
        """The step at which trainer.flops_budget stops the run (the first whose FLOPs reach it), None without one."""
        return budget_steps(self.cfg.trainer.flops_budget, self._tokens_per_step(), self.flops["train_flops_per_token"])

    def _check_run_dir(self) -> list[Path]:
        """check_run_dir of this run's folder under trainer.resume (null outside a multirun/Slurm job, which
        train.py resolves); keeps whether the launch starts over and what it logged. Returns the checkpoints, newest
        first (empty: start from step 0)."""
        found, self.restart, self.restart_logged = check_run_dir(self.run_dir, self.cfg.trainer.resume or False)
        return found

    def _start_over(self) -> None:
        """The folder's earlier launch stopped before its first checkpoint: nothing of it carries over, and the run
        starts from step 0, said in one line. What it wrote that describes a run (its evaluations, per-document
        records, config, data record, kept tokenizer, wandb id) is set aside, never mixed with this run's: this
        launch may train another model on other data."""
        line = f"{self.run_dir} holds no checkpoint to continue from: starting the run over from step 0"
        count = self.restart_logged   # counted by _check_run_dir
        moved = set_aside([self.run_dir / name for name in START_OVER_ASIDE], "before_restart")
        _repoint_records(moved)
        aside = [f"{p.name} ({count} evaluation{'s' * (count != 1)})" if p.name.startswith("metrics.") else p.name
                 for p in moved]
        if aside:
            line += f"; what the stopped launch wrote kept aside as {', '.join(aside)}"
        log.info(line)

    def _check_data_identity(self, resuming: bool) -> dict | None:
        """The data this launch reads (longctx.data.identity) against what the run recorded at its first launch: a
        resume on other data (a dataset replaced under its path, a data.path to other data) is refused, naming
        both ids; the same data at another path (a moved folder) goes on, said once. Returns the record to write
        (this launch's identity) when the run has none yet, else None."""
        identity = data_identity(self.splits.train_path, self.splits.heldout_path)
        recorded = read_identity(self.run_dir)
        where = self.splits.train_path.parent
        if recorded is None:
            if resuming and self.dist.is_main:
                log.info(f"{self.run_dir} has no record of its data ({IDENTITY_FILE}: a run made before runs recorded "
                         f"one); recording the data of this launch, {where} (id {identity['id']})")
            return identity
        if recorded["id"] != identity["id"]:
            then = Path(str(recorded["train"].get("path", "?"))).parent
            raise ValueError(f"data.path: {where} holds other data (id {identity['id']}) than {self.run_dir} was "
                             f"trained on ({then}, id {recorded['id']}, recorded in {IDENTITY_FILE}); resume on "
                             f"that data, or start a new run_name (trainer.init_from={self.run_dir} starts one from "
                             f"its weights). Nothing was written.")
        if recorded["train"].get("path") != identity["train"]["path"] and self.dist.is_main:
            log.info(f"data.path: the run's data (id {identity['id']}) is now read from {where} (it was at "
                     f"{Path(str(recorded['train'].get('path'))).parent}); the same tokens, so the run goes on")
        return None

    def _keep_tokenizer(self) -> None:
        """A copy of the dataset's own tokenizer file in the run folder, once (never overwritten, never written
        through a link): the run decodes text even without its dataset."""
        source, kept = tokenizer_file_of(self.splits.train_path), self.run_dir / TOKENIZER_FILE
        if source is not None and not kept.exists():
            write_atomic(kept, source.read_bytes())

    def _stop_met(self, records: list[dict]) -> bool:
        """trainer.stop_when met by the evaluation of the step the run stands at (a resumed run that stopped there)."""
        here = [r for r in records if r.get("step") == self.step]
        return self.stop_when is not None and self.step > 0 and bool(here) and self.stop_when.met(here[-1])

    def _out_of_budget(self) -> bool:
        return budget_reached(self.tokens, self.flops["train_flops_per_token"], self.cfg.trainer.flops_budget)

    def _write_config(self) -> Path:
        """The config this launch trains with: config.yaml at step 0, config.resume_step{N}.yaml when it resumes
        step N, and .launch{k} beside an earlier launch from the same step that ran with another config (a resume
        that failed, then one with other overrides): every config a run trained under is on file, none overwritten.
        Returns its path (the launch's provenance record names it)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        text = OmegaConf.to_yaml(self.cfg, resolve=True)
        stem = "config" if self.step == 0 else f"config.resume_step{self.step}"
        path, k = self.run_dir / f"{stem}.yaml", 1
        while path.exists() and path.read_text() != text:
            k += 1
            path = self.run_dir / f"{stem}.launch{k}.yaml"
        if not path.exists():
            write_atomic(path, text)
        else:
            os.utime(path)  # a launch repeating a config on file: it is the newest launch's (the report reads it)
        return path

    def state_dict(self) -> dict:
        return self.checkpointer.state_dict()  # collective (RNG gather): every rank takes part

    def _load(self, candidates: list[Path]) -> None:
        """Continue from the newest readable checkpoint: one cut short (a full disk, a copy interrupted), a directory
        or a bad schema is skipped with a warning for the older one kept beside it (trainer.keep_checkpoints)."""
        try:
            _, path, state = ckpt.read_newest(ckpt.list_checkpoints(self.run_dir), ckpt.PARTS,
                                              log.warning if self.dist.is_main else None)
        except ckpt.NewerSchemaError as err:
            raise ValueError(f"trainer.resume: {err}. Nothing was written.") from None
        except ckpt.CheckpointError as err:
            raise ValueError(f"trainer.resume: {err}; move them away to start over") from None
        try:
            ckpt.check_writable(self.run_dir, state["trainer"]["step"])  # before training, not at its first save
        except ckpt.CheckpointError as err:
            raise ValueError(f"trainer.resume: {err}") from None
        self._check_same_model(state, path)
        self._refuse_non_finite(state, path, "trainer.resume", "move it aside to resume from the older checkpoint "
                                "kept beside it (trainer.keep_checkpoints)")
        notes = self._resume_decision(state)
        if self.dist.is_main:
            log.info(f"resuming from {path} (step {state['trainer']['step']})")
            for note in notes:
                log.info(note)
        # every part but the optimizer and its schedule as saved; those two as the resume decision says
        try:  # a part that does not fit (a damaged or edited checkpoint): one line naming it, before any step
            for name, part in self.checkpointer.parts.items():
                if name not in ("optimizer", "scheduler"):
                    part.load_state_dict(state[name])
            name = "optimizer"
            self._restore_optimizer(state)
            check_optimizer_state(self.optimizer)
        except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as err:
            raise ValueError(f"trainer.resume: {path}: its {name} state cannot be loaded ({type(err).__name__}: "
                             f"{str(err).splitlines()[0] if str(err) else 'no detail'}); move it aside to resume from "
                             f"the older checkpoint kept beside it (trainer.keep_checkpoints)") from None
        self.checkpointer.parts["scheduler"] = self.scheduler  # rebuilt by _restore_optimizer

    def _set_aside_unreadable(self, step: int) -> None:
        """The checkpoints newer than the one resumed from were skipped as unreadable: renamed aside (kept, never
        deleted), so the pruning of trainer.keep_checkpoints never keeps them in place of a readable one."""
        for newer, path in ckpt.list_checkpoints(self.run_dir):
            if newer > step and path.is_file():
                twin = path.with_suffix(".safetensors")  # its weights: never taken for the newest weights either
                moved = [p.name for p in set_aside([path, twin], "unreadable", after_name=True)]  # earlier ones kept
                log.warning(f"{path.name}: unreadable, kept aside as {' and '.join(moved)} (the run continues from "
                            f"step {step}; checkpoint pruning counts only readable ones)")

    def _resume_decision(self, state: dict) -> list[str]:
        """Compare the run's saved config with this launch's (longctx.train.resume): refuse a change the checkpoint
        cannot take, naming it; return the console lines that say what changed and how it is applied."""
        saved = state.get("config")
        if saved is None:
            return []
        step = state["trainer"]["step"]
        # paths of a run recorded before they were stored absolute: resolved as this launch's are
        schedule, applied, refused = classify(config_changes(resolve_run_paths(saved),
                                                             OmegaConf.to_container(self.cfg, resolve=True)))
        if refused:
            raise ValueError(refusal(self.run_dir, step, refused))
        notes = []
        old = saved_schedule(state.get("scheduler") or {})
        if old is None:  # a checkpoint older than the schedule record: its config's schedule
            old = Schedule.from_config(OmegaConf.create(saved["optim"]), saved["trainer"]["max_steps"])
        if "optim.warmup_steps" not in schedule and step >= old.warmup_steps:
            # a warmup the run has done (fitted to its length, optim.fitted_warmup) is not redone when it gets longer
            self.schedule = dataclasses.replace(self.schedule, warmup_steps=old.warmup_steps)
        self.schedule = old.resumed(step, self.schedule)
        if schedule or not old.same_curve(self.schedule):
            what = (format_changes(schedule) if schedule
                    else f"the schedule's end {old.max_steps} -> {self.schedule.max_steps}")
            notes.append(f"resume at step {step}: {what}: the schedule is recomputed from step {step}: "
                         f"{self.schedule.describe(step)}")
        if format_changes(applied):
            notes.append(f"resume at step {step}: {format_changes(applied)} (applied from this step)")
        return notes

    def _restore_optimizer(self, state: dict) -> None:
        """The optimizer's saved state, with this launch's betas/eps/weight decay, and the schedule: its saved
        state when unchanged (resume stays exact), else torch's schedulers rebuilt at the current step."""
        old = saved_schedule(state["scheduler"])
        if old is not None and old == self.schedule:
            self.scheduler = build_scheduler(self.optimizer, self.schedule, self.schedule.start)
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
        else:
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler = build_scheduler(self.optimizer, self.schedule, state["trainer"]["step"])
        apply_hyperparameters(self.optimizer, self.cfg.optim)

    def _check_same_tokens(self, source_run: Path, source: str) -> None:
        """Weights trained on text ids of one tokenizer go on with ids of the same one: another tokenizer's (or
        another BPE's of the same size) would map the embeddings onto other text unseen. Checked where both the
        source run and this data record a tokenizer (generated data's ids are states, not text)."""
        from longctx.data.tokenizer import describe_tokens, split_tokens, tokens_differ
        from longctx.generate import recorded_tokens

        theirs = recorded_tokens(source_run)
        if not theirs or not theirs.get("tokenizer"):
            return
        ours = split_tokens(self.splits.train_path)
        if ours.get("tokenizer") and tokens_differ(theirs, ours):
            raise ValueError(f"trainer.init_from={source!r}: its weights were trained on ids of "
                             f"{describe_tokens(theirs)}, but {self.splits.train_path} holds ids of "
                             f"{describe_tokens(ours)}; prepare this data with that tokenizer, or start from weights "
                             f"trained on this one")

    def _init_weights(self, source: str) -> None:
        """A new run from another run's weights (trainer.init_from): the model only; optimizer, schedule,
        data order and step count start fresh. The model must be the same (ctx and data may differ). A Hugging Face
        checkpoint folder (config.json + safetensors) maps onto the model: longctx.hf.import_weights."""
        path = Path(str(source)).expanduser()
        if is_hf_folder(path):
            from longctx.hf.import_weights import load_checkpoint
            kept = load_checkpoint(self.model, path)  # names of the attention cores' own tensors, left as initialised
            kinds = sorted({name.split(".", 2)[-1] if name.startswith("blocks.") else name for name in kept})
            if self.dist.is_main:
                log.info(f"weights from the Hugging Face checkpoint {path}; as the attention initialises them: "
                         f"{', '.join(kinds) or 'none'}; the tokens and FLOPs trained before are not known "
                         f"(tokens_all_stages counts from here)")
            return
        try:
            if path.is_dir():
                found = ckpt.list_checkpoints(path)
                if not found:
                    raise FileNotFoundError(f"trainer.init_from={str(source)!r}: holds no checkpoint "
                                            f"(looked in {ckpt.checkpoint_dir(path)})")
                _, path, state = ckpt.read_newest(found, ("model",), log.warning if self.dist.is_main else None)
            elif path.suffix == ".safetensors" and path.is_file():   # the weights written beside a checkpoint
                state = ckpt.read_weights(path)   # (no pickle); its step is in its name, for the tokens before
                named = re.fullmatch(r"step_(\d{8})\.safetensors", path.name)
                state["trainer"] = {"step": int(named[1])} if named else {}
            elif path.is_file():
                state = ckpt.read(path, ("model",))
            else:
                raise FileNotFoundError(f"trainer.init_from={str(source)!r}: no such run directory or checkpoint file")
        except ckpt.CheckpointError as err:
            raise ValueError(f"trainer.init_from={str(source)!r}: {err}") from None
        self._check_same_model(state, path, key="trainer.init_from", may_differ=("ctx",))
        self._check_same_tokens(path.parent.parent if path.parent.name == "checkpoints" else path.parent, source)
        self._refuse_non_finite(state, path, "trainer.init_from", "name an earlier checkpoint file of that run")
        self.model.load_state_dict(state["model"])
        step = state.get("trainer", {}).get("step")
        self.prior_tokens, self.prior_flops = prior_training(path, step)
        if self.dist.is_main:
            log.info(f"weights from {path} (step {step if step is not None else 'unknown'}); optimizer, schedule and "
                     f"step count start fresh; {self.prior_tokens:,} tokens and {self.prior_flops:.3g} FLOPs trained "
                     f"before (tokens_all_stages, flops_all_stages)")

    def _check_same_model(self, state: dict, path: Path, key: str = "trainer.resume", may_differ=()) -> None:
        """A checkpoint only continues the model that wrote it: name what changed, in config terms."""
        saved, now = state.get("spec") or {}, self.spec.__dict__
        changed = [f"{SPEC_KEYS.get(k, k)}: {saved[k]!r} -> {now[k]!r}" for k in now
                   if k in saved and k not in RUNTIME_SPEC_FIELDS + tuple(may_differ) and saved[k] != now[k]]
        if not changed:  # the spec agrees (or predates it): the weights' names and shapes must too
            changed = ckpt.weight_differences(self.model.state_dict(), state["model"])
        if changed:
            shown = "; ".join(changed[:6]) + (f"; and {len(changed) - 6} more" if len(changed) > 6 else "")
            hint = ("resume with the run's own config (" + str(self.run_dir / "config.yaml") + ") or start a new "
                    "run_name") if key == "trainer.resume" else "build the same model (arch, attention, model.*)"
            raise ValueError(f"{key}: {path} was written by a different model ({shown}); {hint}")

    @staticmethod
    def _refuse_non_finite(state: dict, path: Path, key: str, advice: str) -> None:
        """Weights holding NaN or infinities train nothing (the first step's loss is NaN): refused before any work,
        as evaluate refuses them."""
        bad = ckpt.first_non_finite(state["model"])
        if bad is not None:
            raise ValueError(f"{key}: {path}: non-finite weights ({bad} holds NaN or infinite values); {advice}. "
                             f"Nothing was written.")

    def save(self) -> None:
        state = self.checkpointer.state_dict()  # collective (RNG gather): every rank takes part
        if self.dist.is_main:
            self.checkpointer.save(self.step, state)  # a failed write raises ckpt.CheckpointWriteError (one line)
        barrier(self.dist)

    # ----- numerics ---------------------------------------------------------------------------------------
    def autocast(self):
        return autocast(self.device, self.cfg.trainer.precision)

    def train_step(self, batch: dict) -> float:
        """One optimizer step over the local batch, in micro-batches of trainer.micro_docs documents."""
        inputs, targets = batch["inputs"].to(self.device), batch["targets"].to(self.device)
        doc_ids = batch["doc_ids"].to(self.device) if "doc_ids" in batch else None  # data.pack: packed documents
        local_docs = inputs.shape[0]
        micro = self.cfg.trainer.micro_docs or local_docs
        counted = targets.numel()  # the step's loss is the mean over the targets it counts, all ranks together
        if self.loss_on_queries:  # the other targets are IGNORE (NLL 0): divide by the world's count, per rank
            n = all_reduce_sum((targets != IGNORE).sum().double(), self.dist)
            counted = max(float(n.item()), 1.0) / self.dist.world_size
        starts = list(range(0, local_docs, micro))
        loss_sum = torch.zeros((), device=self.device, dtype=torch.float64)
        for i, s in enumerate(starts):
            sync = i == len(starts) - 1
            no_sync = (self.train_model.no_sync() if self.dist.enabled and not sync else contextlib.nullcontext())
            with no_sync, self.autocast():
                # summed NLL (fp32): its backward scales gradients the forward formed (models.common.nll_sum)
                packed = {} if doc_ids is None else {"doc_ids": doc_ids[s:s + micro]}
                loss = self.train_model(inputs[s:s + micro], targets[s:s + micro], reduction="sum",
                                        **packed) / counted
            loss.backward()
            loss_sum += loss.detach().double()
        loss_value = float(all_reduce_sum(loss_sum, self.dist).item()) / self.dist.world_size
        clip = self.cfg.optim.grad_clip if self.cfg.optim.grad_clip is not None else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip))
        bad = [name for name, v in (("loss", loss_value), ("grad_norm", grad_norm)) if not math.isfinite(v)]
        if bad:
            self._non_finite(bad, loss_value, grad_norm)
        else:
            self.consecutive_skips = 0
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss_value

    def choose_checkpointing(self, batch: dict) -> None:
        """trainer.activation_checkpointing=auto: recompute the blocks' activations in the backward only when a
        micro-batch's activations do not fit. On CUDA one micro-batch runs forward and backward without it (its
        gradients are discarded; no optimizer step, no randomness drawn) and checkpointing is turned on if that ran
        out of memory or left under ~10% of the card beside the optimizer's state. Every rank must agree. On CPU
        it stays off (host memory)."""
        if self.device.type != "cuda":
            return
        micro = self.cfg.trainer.micro_docs or batch["inputs"].shape[0]
        inputs, targets = batch["inputs"][:micro].to(self.device), batch["targets"][:micro].to(self.device)
        packed = {"doc_ids": batch["doc_ids"][:micro].to(self.device)} if "doc_ids" in batch else {}  # data.pack
        torch.cuda.reset_peak_memory_stats(self.device)
        no_sync = self.train_model.no_sync() if self.dist.enabled else contextlib.nullcontext()
        try:
            with no_sync:
                with self.autocast():
                    loss = self.train_model(inputs, targets, reduction="sum", **packed)
                loss.backward()
            del loss
            peak = torch.cuda.max_memory_allocated(self.device)
            adam_state = 2 * 4 * sum(p.numel() for p in self.model.parameters())
            fits = peak + adam_state < 0.9 * torch.cuda.get_device_properties(self.device).total_memory
        except torch.cuda.OutOfMemoryError:
            fits, peak = False, None
        self.optimizer.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        too_big = all_reduce_sum(torch.tensor(float(not fits), device=self.device), self.dist).item() > 0
        self.model.spec.checkpoint_activations = too_big
        if self.dist.is_main:
            seen = f"peak {peak / 2 ** 30:.1f} GiB" if peak is not None else "out of memory"
            log.info(f"trainer.activation_checkpointing=auto: {'on' if too_big else 'off'} (one micro-batch of "
                     f"{micro} x {inputs.shape[1]} tokens without it: {seen})")

    def _non_finite(self, names: list[str], loss: float, grad_norm: float) -> None:
        """Never a silent NaN run: stop naming the step and metric, or (trainer.on_nonfinite=skip) skip
        the update, up to trainer.max_skipped_steps in a row."""
        what = f"non-finite {' and '.join(names)} at step {self.step + 1} (loss={loss}, grad_norm={grad_norm})"
        self.consecutive_skips += 1
        self.skipped_steps += 1
        if self.cfg.trainer.on_nonfinite == "stop":
            raise FloatingPointError(f"{what}; stopping (trainer.on_nonfinite=stop)")
        if self.consecutive_skips > self.cfg.trainer.max_skipped_steps:
            raise FloatingPointError(f"{what}; {self.consecutive_skips} steps in a row, more than "
                                     f"trainer.max_skipped_steps={self.cfg.trainer.max_skipped_steps}; stopping")
        if self.dist.is_main:
            log.warning(f"{what}; update skipped (trainer.on_nonfinite=skip)")

    def evaluate(self, train_loss: float, tokens_per_s: float, data_wait: float) -> dict | None:
        """The heldout evaluation (all ranks together), logged with its per-document record. A non-finite heldout loss
        follows trainer.on_nonfinite: stop raises; skip warns and returns None (nothing logged, no checkpoint).
        data_wait: the fraction of the training time since the last evaluation spent waiting for the reader."""
        n, layout = self.evaluation.n_docs, self.layout
        share = range(layout.dp_rank * n // layout.dp_world, (layout.dp_rank + 1) * n // layout.dp_world)
        # with CP, each CP group evaluates its share of whole documents (every rank gets their whole per-token
        # losses), summed over the ranks holding the same slice: what one process computes, counted once
        model = self.model if layout.cp is None else ContextParallelModel(self.model, layout.cp)
        self.model.eval()
        with progress_bar(self.dist.is_main, total=n, desc=f"eval step {self.step}", unit="doc", leave=False) as bar:
            result = self.evaluation.run(model, self.cfg.trainer.micro_docs or self.cfg.data.docs_per_batch,
                                         self.cfg.trainer.precision, share,
                                         lambda t: all_reduce_sum(t, self.dist, layout.dp_group),
                                         lambda done: bar.update(done * layout.dp_world))
        self.model.train()
        if not result.finite:
            curve = result.reached_curve
            what = (f"non-finite heldout loss at step {self.step} (mean {result.mean_loss}, "
                    f"{int((~np.isfinite(curve)).sum())} of {len(curve)} positions)")
            if self.cfg.trainer.on_nonfinite == "stop":
                raise FloatingPointError(f"{what}; stopping without a checkpoint (trainer.on_nonfinite=stop)")
            if self.dist.is_main:
                log.warning(f"{what}; not logged and not checkpointed (trainer.on_nonfinite=skip)")
            return None
        curve = result.per_position
        record = {"step": self.step, "tokens": self.tokens, "elapsed_s": round(self.elapsed, 2),
                  "train_loss": train_loss, "lr": self.scheduler.get_last_lr()[0], "tokens_per_s": tokens_per_s,
                  "data_wait": round(data_wait, 4), "skipped_steps": self.skipped_steps}
        record.update({k: self.flops[k] for k in ("weight_flops_per_token", "state_flops_per_token",
                                                      "executed_state_flops_per_token", "wsfr", "state_size")})
        record["flops"] = self.tokens * self.flops["train_flops_per_token"]
        record["tokens_all_stages"] = self.prior_tokens + self.tokens  # the weights' whole training (init_from)
        record["flops_all_stages"] = self.prior_flops + record["flops"]
        record["epochs"] = round(self.tokens / self.train_tokens, 4)  # passes over the training split
        record["mfu"] = mfu(tokens_per_s, self.flops["train_flops_per_token"], self.device_name, self.dist.world_size)
        record.update(result.summary)
        record["heldout_loss"] = result.mean_loss   # packed rows: over the positions some document reaches
        # train_loss: since the last evaluation, over the targets the loss counts (data.loss_on: the queried values)
        counted = "recall_loss" if self.loss_on_queries else "heldout_loss"
        record["heldout_minus_train"] = record[counted] - train_loss
        if record["epochs"] > 1 and not self.said_epochs and self.dist.is_main:
            self.said_epochs = True  # once a launch: the data repeats from here on
            log.info(f"step {self.step}: {record['epochs']:.2f} passes over the {self.train_tokens:,} training tokens "
                     f"so far; heldout minus train loss {record['heldout_minus_train']:+.4f} (metrics.jsonl: epochs, "
                     f"heldout_minus_train)")
        if self.dist.is_main:
            # The raw per-position curve: inline for short contexts, beside the log for long ones (a 64k
            # curve is ~0.5 MB of JSON per evaluation).
            if len(curve) <= INLINE_CURVE_MAX:
                record["per_position_loss"] = [round(float(x), 5) for x in curve]
            else:
                folder = self.run_dir / "per_position_loss"
                folder.mkdir(exist_ok=True)
                buffer = io.BytesIO()
                np.save(buffer, curve.astype(np.float32))
                write_atomic(folder / f"step_{self.step:08d}.npy", buffer.getvalue())
            record["doc_bins"] = step_record_path(self.step)  # each document's binned loss (paired comparisons)
            arrays = doc_record(self.evaluation, result)
            record["doc_bins_digest"] = loss_digest(arrays["loss"])   # the report tells a replaced file by it
            write_doc_record(self.run_dir / record["doc_bins"], arrays)
            self.jsonl.log(record)
            png = plot_icl_curves(self.jsonl.records(), self.run_dir / "icl_curves.png",
                                  f"{self.cfg.run_name}: ICL curves over training")
            if self.wandb is not None:
                self.wandb.log_eval(self.step, record, png)
        return record

    # ----- loop -------------------------------------------------------------------------------------------
    def fit(self) -> dict:
        if self.complete:
            return self._report_complete()
        try:
            return self._fit()
        finally:
            if self.wandb is not None:
                self.wandb.finish()
            close_logging()
            self._release()

    def _report_complete(self) -> dict:
        records = self.jsonl.records() if self.jsonl else []
        if self.dist.is_main:
            budget = self.cfg.trainer.flops_budget
            if self._out_of_budget() and self.step < self.cfg.trainer.max_steps:
                log.info(f"{self.run_dir} is complete (step {self.step}: trainer.flops_budget={budget:.4g} reached); "
                         f"nothing to do. Raise trainer.flops_budget to train it further.")
            elif self.step < self.cfg.trainer.max_steps:
                log.info(f"{self.run_dir} is complete (step {self.step}: trainer.stop_when={self.stop_when} met); "
                         f"nothing to do. Raise or clear trainer.stop_when to train it further.")
            else:
                log.info(f"{self.run_dir} is complete (step {self.step} of trainer.max_steps="
                         f"{self.cfg.trainer.max_steps}); nothing to do. Raise trainer.max_steps to train it further "
                         f"(the lr continues from where it stands, {self.schedule.lr_at(self.step):.3g}: no re-warming).")
            if records:
                log.info(self._final_summary(records[-1]))
        shutdown(self.dist)
        close_logging()
        self._release()
        return records[-1] if records else {"step": self.step, "tokens": self.tokens}

    def _fit(self) -> dict:
        cfg = self.cfg
        max_steps, eval_every, console_every = cfg.trainer.max_steps, cfg.trainer.eval_every, cfg.logger.console_every
        self.launch_start, self.launch_step = time.perf_counter(), self.step  # durations: a monotonic clock
        batches = iter(self.reader)
        if self.dist.is_main:
            params = sum(p.numel() for p in self.model.parameters())
            log.info(f"{cfg.run_name}: {params / 1e6:.2f}M parameters on {self.device_name} x{self.dist.world_size}; "
                     f"forward FLOPs/token weight {self.flops['weight_flops_per_token']:.3g}, state "
                     f"{self.flops['state_flops_per_token']:.3g} (WSFR {format_ratio(self.flops['wsfr'])}); MFU counts 3x "
                     f"the forward FLOPs of the form that runs, not checkpointing's recomputation")
            if not is_terminal():
                log.info(f"progress: a line every logger.console_every={console_every} steps and at each evaluation "
                         f"(trainer.eval_every={eval_every}); metrics in {self.run_dir / 'metrics.jsonl'}")
        # A bar on a terminal only; in a log file (Slurm, CI) progress is the console_every lines.
        bar = progress_bar(self.dist.is_main, total=self.schedule.max_steps, initial=self.step, desc=cfg.run_name,
                           unit="step")
        probed = None  # the batch the checkpointing probe ran on: trained on next, as any other
        if self.step < max_steps and self.cfg.trainer.activation_checkpointing == "auto":
            probed = next(batches)
            self.choose_checkpointing(probed)
        with StopSignals() as stop:
            record = self._steps(batches, probed, bar, stop)
        bar.close()
        if self.dist.is_main:
            took = self._launch_time()
            log.info(self._final_summary(record, took) if record is not None else
                     f"final (step {self.step}, {took}): no finite evaluation to report (trainer.on_nonfinite=skip)")
            if self.wandb is not None:
                log.info(self.wandb.describe())
        shutdown(self.dist)
        return record

    def _steps(self, batches, probed, bar, stop: StopSignals) -> dict | None:
        """The training steps from self.step to trainer.max_steps (or the FLOP budget) -> the last evaluation's record.
        A stop signal ends them after the step in progress, with that step's checkpoint (raises StopRequested)."""
        cfg = self.cfg
        max_steps, eval_every, console_every = cfg.trainer.max_steps, cfg.trainer.eval_every, cfg.logger.console_every
        budget = cfg.trainer.flops_budget
        record, saved = None, None
        end = min(max_steps, self._budget_steps() or max_steps)  # the step this launch trains to
        window_tokens, window_steps, window_start = 0, 0, time.perf_counter()
        line_loss, line_steps, line_tokens, line_time = 0.0, 0, 0, 0.0
        window_wait = window_time = line_wait = 0.0  # seconds waiting for the reader / training, this window
        measured = 0.0  # seconds of this launch's steps 2..MEASURED_STEPS
        while self.step < max_steps:
            t_wait = time.perf_counter()
            batch = probed if probed is not None else next(batches)
            probed = None
            t0 = time.perf_counter()
            wait = t0 - t_wait  # > 0 only when the read-ahead falls behind the steps
            loss = self.train_step(batch)
            self.step += 1
            step_tokens = batch["targets"].numel() * self.dist.world_size
            self.tokens += step_tokens
            step_time = time.perf_counter() - t0
            self.elapsed += step_time
            self.train_loss_sum, self.train_loss_steps = self.train_loss_sum + loss, self.train_loss_steps + 1
            window_tokens, window_steps = window_tokens + step_tokens, window_steps + 1
            line_loss, line_steps, line_tokens = line_loss + loss, line_steps + 1, line_tokens + step_tokens
            line_time += step_time
            line_wait, window_wait, window_time = line_wait + wait, window_wait + wait, window_time + wait + step_time
            lr = self.scheduler.get_last_lr()[0]
            launched = self.step - self.launch_step
            if 1 < launched <= MEASURED_STEPS:
                measured += wait + step_time
                if launched == MEASURED_STEPS and self.step < end and self.dist.is_main:
                    log.info(self._measured_line(measured / (MEASURED_STEPS - 1), end))
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", refresh=False)
            if self.wandb is not None:
                self.wandb.log_train(self.step, {"train/loss": loss, "train/lr": lr, "train/tokens": self.tokens})
            if self.step % console_every == 0 and self.dist.is_main:
                line_total = max(1e-9, line_time + line_wait)  # training steps only, evaluations excluded
                rate, waited = line_tokens / line_total, line_wait / line_total
                waiting = f" | waiting for data {waited:.0%}" if waited >= DATA_WAIT_WARN else ""
                since = time.perf_counter() - self.launch_start  # evaluations included: what the user waits
                log.info(f"step {self.step:>6d}/{max_steps} | train {line_loss / line_steps:.4f} | lr {lr:.2e} | "
                         f"{rate:,.0f} tok/s{waiting} | elapsed {format_duration(since)} | "
                         f"eta {eta(since, launched, end - self.launch_step)}")
                line_loss, line_steps, line_tokens, line_time, line_wait = 0.0, 0, 0, 0.0, 0.0
            out_of_budget = self._out_of_budget()
            if self.step % eval_every == 0 or self.step == max_steps or out_of_budget:
                tokens_per_s = window_tokens / max(1e-9, time.perf_counter() - window_start)
                train_loss = self.train_loss_sum / self.train_loss_steps
                self.train_loss_sum, self.train_loss_steps = 0.0, 0  # before the checkpoint: a resume starts anew
                evaluated = self.evaluate(train_loss, tokens_per_s, window_wait / max(1e-9, window_time))
                if evaluated is not None:  # a skipped non-finite evaluation leaves no checkpoint
                    record = evaluated
                    self.save()
                    saved = self.step
                if self.dist.is_main and evaluated is not None:
                    log.info(self._describe(record))
                    if record["data_wait"] >= DATA_WAIT_WARN and not self.warned_data_wait:
                        log.warning(self._data_wait_advice(record["data_wait"], window_steps))
                        self.warned_data_wait = True
                window_tokens, window_steps, window_start = 0, 0, time.perf_counter()
                window_wait = window_time = 0.0
            if out_of_budget:
                if self.dist.is_main:
                    log.info(f"stopping at step {self.step}: trainer.flops_budget={budget:.3g} reached")
                break
            if record is not None and saved == self.step and self.stop_when and self.stop_when.met(record):
                if self.dist.is_main:
                    log.info(f"stopping at step {self.step} of {max_steps}: trainer.stop_when={self.stop_when} met "
                             f"({self.stop_when.metric} {record[self.stop_when.metric]:.4g})")
                break
            signum = self._stop_signal(stop)
            if signum and self.step < max_steps:
                if saved != self.step:
                    self.save()
                stopped = StopRequested(signum, self.step, self.run_dir,
                                        resume_command(self.run_dir) if self.dist.is_main else None)
                if self.dist.is_main:
                    log.info(str(stopped))
                raise stopped
        return record

    def _stop_signal(self, stop: StopSignals) -> int:
        """The stop signal this rank received, or SIGTERM if only another did (0: none): with several ranks every
        rank learns of a stop after the same step."""
        if not self.dist.enabled:
            return stop.received or 0
        anyone = all_reduce_sum(torch.tensor([float(stop.received or 0)], device=self.device), self.dist).item()
        return (stop.received or int(signal.SIGTERM)) if anyone else 0

    def _data_wait_advice(self, share: float, steps: int) -> str:
        """Why the reader may fall behind, from what it reads: chunks much longer than the context are decoded whole
        for every window (a short context on document-long chunks decodes doc_len / ctx times what it uses)."""
        chunk_len = int(self.reader.array.chunks[1])
        text = (f"training waited for the data reader {share:.0%} of the time over the last {steps} steps "
                f"({self.reader.path}: chunks {tuple(int(c) for c in self.reader.array.chunks)}, ctx={self.cfg.ctx})")
        if chunk_len >= 4 * self.cfg.ctx:
            text += (f"; each {self.cfg.ctx}-token window decodes {chunk_len}-token chunks: write the array in chunks "
                     f"of at most a few contexts along the documents (LongCrawl64's are 2048 x 2048)")
        else:
            text += "; a faster disk or a local copy of the data may help"
        return text

    @staticmethod
    def _describe(rec: dict) -> str:
        return f"step {rec['step']:>6d} | train {rec['train_loss']:.4f} | {eval_line(rec)}"

    def _launch_time(self) -> str:
        """This launch's wall time so far, in words ("this launch": a resumed run's earlier launches took more)."""
        took = format_duration(time.perf_counter() - self.launch_start)
        return f"time this launch {took}" if self.launch_step else f"total time {took}"

    def _measured_line(self, per_step: float, end: int) -> str:
        """The measured step time and what it makes of the steps left: the start-up estimate only assumed a rate."""
        left = per_step * (end - self.step)
        finish = (datetime.datetime.now().astimezone() + datetime.timedelta(seconds=left)).strftime("%H:%M %Z")
        steps = f"{end - self.step} step{'s' if end - self.step > 1 else ''}"
        return (f"measured {per_step:.3g} s/step -> ~{format_duration(left)} for the {steps} left, evaluations not "
                f"counted (ETA {finish})")

    def _final_summary(self, rec: dict, took: str | None = None) -> str:
        lines = [f"final (step {rec['step']}, {rec['tokens']:,} tokens{', ' + took if took else ''}) -> {self.run_dir}",
                 f"  {eval_line(rec)}"]
        lines.append(f"  metrics: {self.run_dir / 'metrics.jsonl'}  plot: {self.run_dir / 'icl_curves.png'}")
        return "\n".join(lines)


def run(cfg: DictConfig) -> dict:
    return Trainer(cfg).fit()
