"""Staged training: one run made of stages trained one after another, each from the previous stage's weights.

`trainer.stages` lists the stages; each is a dict of overrides of the run's composed config (dotted keys, as
typed on the command line), and `{}` is the config as composed. The calibrated long-context ICL recipe
(conf/experiment/icl_curriculum.yaml) is

    trainer:
      stages:
        - {ctx: 1024, data.docs_per_batch: 512, trainer.max_steps: 400}   # forms the in-context circuit
        - {}                                                              # the run's own ctx, documents, steps

Stage i (from 1) trains in `<run_dir>/stage{i}_ctx{ctx}`, a plain run of the trainer: stage 1 from scratch (or the
run's own trainer.init_from), every later stage from the previous stage's newest checkpoint (trainer.init_from: the
weights only; optimizer, schedule and step count start fresh). Every stage is checked before the first trains.
A relaunch with trainer.resume=auto (the default in a multirun) or true skips finished stages and continues the
interrupted one. `<run_dir>/stages.json` names the stage folders in order; the last one holds the run's result.
"""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from longctx.train.config import CONF_DIR, check_keys, check_set, check_types, check_values, schema
from longctx.train.resume import MODEL_GROUPS, MODEL_SHORTCUTS
from longctx.train.run_files import write_atomic

# A stage starts from the previous stage's weights, so it cannot change what the model is (resume.MODEL_GROUPS,
# MODEL_SHORTCUTS).
# Keys the stages themselves set (or that would nest stages).
RESERVED_KEYS = ("run_dir", "trainer.stages", "trainer.init_from")
INDEX = "stages.json"
_ABSENT = object()


def stage_dir_name(index: int, stage_cfg: DictConfig) -> str:
    return f"stage{index + 1}_ctx{stage_cfg.ctx}"


def _fail(index: int, key: str, value, why: str):
    raise ValueError(f"config: trainer.stages[{index}].{key}={value!r}: {why}")


def _check_same_vocabulary(index: int, stage: DictConfig, first: DictConfig) -> None:
    """A stage's data must have the first stage's vocabulary: the model's embedding and head are sized by it, and a
    stage starts from the previous stage's weights (caught here, before the first stage trains)."""
    from longctx.train.estimate import data_vocab

    mine, theirs = data_vocab(stage), data_vocab(first)
    if mine != theirs:
        raise ValueError(f"config: trainer.stages[{index}]: its data has {mine} tokens in its vocabulary, stage 0's "
                         f"{theirs}; a stage starts from the previous stage's weights, whose embedding is sized by "
                         f"the vocabulary (keep data.vocab, data.n_keys and data.n_values across the stages)")


def _overrides(cfg: DictConfig) -> list[dict]:
    """Each stage's overrides, their values resolved against the run's config (a stage may say ${contexts.c1024})."""
    stages = cfg.trainer.get("stages")
    if not OmegaConf.is_list(stages) or len(stages) == 0:
        raise ValueError(f"config: trainer.stages={stages!r}: must be a non-empty list of dicts of overrides "
                         f"(e.g. [{{ctx: 1024, trainer.max_steps: 400}}, {{}}]) or null")
    resolved = OmegaConf.to_container(stages, resolve=True)
    for i, stage in enumerate(resolved):
        if not isinstance(stage, dict):
            raise ValueError(f"config: trainer.stages[{i}]={stage!r}: must be a dict of overrides (`{{}}`: the "
                             f"config as composed)")
    return resolved


def _check_key(index: int, key: str, value, cfg: DictConfig) -> None:
    if key in RESERVED_KEYS:
        _fail(index, key, value, "set by the stages themselves (each stage starts from the previous one's weights)")
    if key.startswith(MODEL_GROUPS) or key in MODEL_SHORTCUTS:
        _fail(index, key, value, "a stage starts from the previous stage's weights, so it cannot change the "
                                 "model (model.*, arch.*, attention.*, p, window)")
    if OmegaConf.select(cfg, key, default=_ABSENT, throw_on_missing=False) is _ABSENT:
        _fail(index, key, value, "unknown key (the run's config has no such key)")


def plan(cfg: DictConfig, choices: dict | None = None, check: bool = True) -> list[tuple[Path, DictConfig]]:
    """(folder, config) of every stage. `check`: each stage's config checked as a run's would be (the run's keys
    once, every stage's types and values), so a bad stage fails here, before anything trains, naming
    trainer.stages[i] and the key; each stage's trainer checks its config again when it starts."""
    run_dir = Path(str(cfg.run_dir))
    known = schema(CONF_DIR, choices) if check else None
    if check:
        check_keys(cfg, known)
        check_set(cfg)
    stages, previous = [], None
    for i, overrides in enumerate(_overrides(cfg)):
        stage = copy.deepcopy(cfg)
        for key, value in overrides.items():
            _check_key(i, key, value, cfg)
            OmegaConf.update(stage, key, value, merge=False)
        try:
            if check:
                check_types(stage, known)
                check_values(stage)
        except ValueError as err:
            raise ValueError(f"trainer.stages[{i}]: {err}") from None
        if check and stages:
            _check_same_vocabulary(i, stage, stages[0][1])
        folder = run_dir / stage_dir_name(i, stage)
        stage.run_name = f"{cfg.run_name}_{folder.name}"
        stage.run_dir = str(folder)
        stage.trainer.stages = None
        if stage.trainer.resume is True and i > 0:  # continue the run: the stages after the interrupted one start
            stage.trainer.resume = "auto"              # afresh; the first keeps true (no checkpoint: no such run)
        if previous is not None:
            stage.trainer.init_from = str(previous)
        stages.append((folder, stage))
        previous = folder
    return stages


class StageError(ValueError):
    """A later stage that cannot start or continue: said in one line, like a bad config (train.py)."""


def _records(folder: Path) -> list[dict]:
    """A stage's evaluation records (its metrics.jsonl; none before its first evaluation)."""
    from longctx.train.loggers import JsonlLogger

    return JsonlLogger(folder).records()


def _prior_tokens(records: list[dict]) -> int | None:
    """The tokens a stage's weights had trained before it started (its first record's tokens_all_stages - tokens),
    None before its first evaluation. `records`: the stage's (_records)."""
    first = records[0] if records else {}
    if "tokens_all_stages" not in first or "tokens" not in first:
        return None
    return int(first["tokens_all_stages"]) - int(first["tokens"])


def _stale(index: int, previous: Path, folder: Path, theirs: list[dict], mine: list[dict]) -> str | None:
    """Why stage `index` (in `folder`, its records `mine`) no longer follows from the stage before it (in `previous`,
    its records `theirs`): it started from weights that had trained N tokens, and that stage has trained more since
    (a relaunch that lengthened it); None where it follows, or has not started."""
    start = _prior_tokens(mine)
    now = theirs[-1].get("tokens_all_stages") if theirs else None
    if start is None or now is None or int(now) == start:
        return None
    return (f"trainer.stages[{index}] ({folder.name}) started from {previous.name}'s weights after {start:,} tokens, "
            f"and {previous.name} has trained to {int(now):,} since: continuing it would not follow from that stage's "
            f"weights (start another run_name, or relaunch with the stages as they ran)")


def _index(stages: list[tuple[Path, DictConfig]], cfg: DictConfig) -> dict:
    return {"stages": [{"dir": folder.name, "overrides": overrides}
                       for (folder, _), overrides in zip(stages, _overrides(cfg))]}


class StagedRun:
    """A run of `trainer.stages`; the same interface as Trainer (checks at construction, `fit()` -> the final
    stage's last record)."""

    def __init__(self, cfg: DictConfig, choices: dict | None = None, make_trainer=None):
        from longctx.train.trainer import Trainer

        self.run_dir = Path(str(cfg.run_dir))
        self.stages = plan(cfg, choices)
        self.read: dict[int, list[dict]] = {}  # stage index -> its records, read once until a stage trains
        self.index = _index(self.stages, cfg)
        self.make_trainer = make_trainer or (lambda stage_cfg: Trainer(stage_cfg, choices))
        path = self.run_dir / INDEX
        if path.exists() and json.loads(path.read_text()) != self.index:
            raise ValueError(f"config: trainer.stages: {self.run_dir} was trained with other stages (see {path}); "
                             f"relaunch it with the same stages, or start another run_name")
        # the later stages' data and memory, then the first stage's own checks (resume, data, an earlier run in its
        # folder), before anything is written
        for i, (_, stage_cfg) in enumerate(self.stages[1:], 1):
            check_stage_fits(i, stage_cfg)
        for i in range(1, len(self.stages)):   # a later stage that already ran from weights since trained further
            self._refuse_stale(i)
        self.first = self.make_trainer(self.stages[0][1])
        if len(self.stages) > 1 and not self.first.complete and _prior_tokens(self._continued(1)) is not None:
            self.first.close()   # let go of the run folder: nothing trains
            raise StageError(f"config: trainer.stages[0] ({self.stages[0][0].name}) would train further (to "
                             f"trainer.max_steps={self.stages[0][1].trainer.max_steps}) but {self.stages[1][0].name} "
                             f"already started from its weights: start another run_name, or relaunch with the stages "
                             f"as they ran")

    def _records(self, i: int) -> list[dict]:
        if i not in self.read:
            self.read[i] = _records(self.stages[i][0])
        return self.read[i]

    def _continued(self, i: int) -> list[dict]:
        """Stage i's records, none where its trainer will start it over (trainer.starts_over: its launch stopped
        before its first checkpoint): it then starts from the stage before's weights as they are, its records set
        aside unread, so nothing of it can be stale. A folder its trainer refuses keeps its records here: judged
        before any stage trains."""
        from longctx.train.trainer import starts_over

        return [] if starts_over(self.stages[i][0]) else self._records(i)

    def _refuse_stale(self, i: int) -> None:
        mine = self._continued(i)
        if _prior_tokens(mine) is None:   # not started, or starting over: the stage before's records are not read
            return
        why = _stale(i, self.stages[i - 1][0], self.stages[i][0], self._records(i - 1), mine)
        if why:
            raise StageError(f"config: {why}")

    def fit(self) -> dict:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path = self.run_dir / INDEX
        if not path.exists():
            write_atomic(path, json.dumps(self.index, indent=1) + "\n")
        record = self.first.fit()
        for i, (_, stage_cfg) in enumerate(self.stages[1:], 1):
            self.read.clear()       # the stage before may have trained on in this launch: read anew
            self._refuse_stale(i)
            try:
                trainer = self.make_trainer(stage_cfg)
            except (ValueError, FileNotFoundError, FileExistsError) as err:  # its own checks, as the first stage's
                raise StageError(f"trainer.stages[{i}]: {err}") from None
            record = trainer.fit()
        return record


def check_stage_fits(index: int, stage_cfg: DictConfig) -> None:
    """What a stage's trainer checks of its data and memory when it starts (ctx against the documents' length,
    data.docs_per_batch against their number, the memory estimate), for a stage after the first: a stage that
    cannot run fails before any stage trains, naming trainer.stages[index]."""
    from longctx.models.spec import model_spec, model_vocab_size
    from longctx.train.data import check_batch_fits, resolve_splits
    from longctx.train.estimate import check_fits
    from longctx.train.trainer import pick_device

    world_size = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun's; the trainer's process group has the same
    try:
        check_fits(stage_cfg, pick_device(stage_cfg.device),
                   lambda vocab: model_spec(stage_cfg, model_vocab_size(vocab)), world_size, say=False)
        check_batch_fits(resolve_splits(stage_cfg.data, stage_cfg.ctx), stage_cfg.data)
    except (ValueError, FileNotFoundError) as err:
        raise ValueError(f"trainer.stages[{index}]: {err}") from None


def final_stage_dir(run_dir: str | Path) -> Path | None:
    """The folder holding a staged run's result (its last stage), or None for a run without stages."""
    path = Path(run_dir) / INDEX
    if not path.exists():
        return None
    return Path(run_dir) / json.loads(path.read_text())["stages"][-1]["dir"]
