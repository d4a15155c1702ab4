"""Validation of the composed Hydra config: every bad value fails here, before any work, naming its key.

Three passes, each raising `ValueError("config: <key>=<value>: <why>")` (train.py prints it as one line):
1. keys: every key must be one the config files define (conf/config.yaml and the chosen option of each
   group) -- train.py names a mistyped key or group option before Hydra composes (launch.check_overrides, with or
   without `+`); this pass catches a key of another option than the chosen one, or one added otherwise;
   mandatory values (`???`, e.g. data.path of data=longcrawl64) must be set;
2. types: a key whose defaults are numbers, booleans or lists takes only those (optim.lr=abc is refused);
3. values: ranges and choices, below.
"""
from __future__ import annotations

import difflib
import functools
import math
import os
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from longctx.train.run_dir import check_run_name
from longctx.train.stop_when import parse_stop_when

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
PRECISIONS = ("auto", "bf16", "fp32")
DEVICES = ("auto", "cpu", "cuda")
RESUME = (None, False, True, "auto")
WANDB_MODES = ("offline", "online", "disabled")
MISSING = "???"
# Keys whose own check below is richer than the type pass (trainer.resume takes false/true/auto/null, ...).
SELF_CHECKED = {"trainer.resume", "trainer.compile", "trainer.activation_checkpointing"}
COMPILE = (False, True, "blocks", "model")
CHECKPOINTING = (False, True, "auto")
NULLABLE = {"optim.grad_clip"}  # null is a documented value although the default is a number


def _fail(key: str, value, why: str):
    raise ValueError(f"config: {key}={value!r}: {why}")


# ----- 1. keys --------------------------------------------------------------------------------------------
def _leaves(node, prefix: str = ""):
    """(dotted key, raw value) of every leaf of a plain container; empty dicts count as leaves."""
    for key, value in node.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from _leaves(value, full + ".")
        else:
            yield full, value


@functools.lru_cache(maxsize=1024)
def _parsed(path: str, mtime_ns: int) -> tuple[dict, bool]:
    """A config file's content as a plain dict and whether it is a `@package _global_` file: each file is parsed
    once per change (the override checks and validate ask for the same files again and again)."""
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}
    return raw, "@package _global_" in Path(path).read_text()


def _config_file(path: Path) -> tuple[dict, bool]:
    return _parsed(str(path), path.stat().st_mtime_ns)


def _file_leaves(path: Path, group: str | None):
    raw, is_global = _config_file(path)
    raw = {k: v for k, v in raw.items() if k not in ("defaults", "hydra")}
    return _leaves(raw, "" if group is None or is_global else f"{group}.")


def schema(conf_dir: Path = CONF_DIR, choices: dict | None = None) -> dict[str, set]:
    """Every key the config files define -> the set of its defaults' kinds ('any', 'number', 'int', 'bool',
    'list', 'str'). `choices` (Hydra's group -> chosen option) limits each group to its chosen file; without
    it, every option of every group counts."""
    found: dict[str, set] = {}

    def add(leaves):
        for key, value in leaves:
            found.setdefault(key, set()).add(_kind(value))

    def add_file(path: Path, group: str) -> None:
        """A group option's keys, and those of the options of its own group it extends (its defaults list)."""
        add(_file_leaves(path, group.replace("/", ".")))
        for entry in (_config_file(path)[0].get("defaults") or []):
            if isinstance(entry, str) and entry != "_self_" and (path.parent / f"{entry}.yaml").exists():
                add_file(path.parent / f"{entry}.yaml", group)

    add(_file_leaves(conf_dir / "config.yaml", None))
    folders = sorted(p for p in conf_dir.rglob("*") if p.is_dir() and p.name != "hydra")
    for folder in folders:
        group = folder.relative_to(conf_dir).as_posix()       # nested groups too, e.g. experiment/arm
        if choices is not None and group in choices:
            option = choices[group]
            files = [folder / f"{option}.yaml"] if option is not None else []
            if not all(path.exists() for path in files):  # an option from elsewhere (hydra.searchpath)
                files = sorted(folder.glob("*.yaml"))
        else:
            files = sorted(folder.glob("*.yaml"))
        for path in files:
            if path.exists():
                add_file(path, group)
    return found


def _kind(value) -> str:
    if value is None or value == MISSING or (isinstance(value, str) and "${" in value):
        return "any"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "number"
    if isinstance(value, list):
        return "list"
    return "str"


def did_you_mean(name: str, names) -> str:
    """"; did you mean X?" naming the closest of `names` to a mistyped `name`; "" if none is close."""
    close = difflib.get_close_matches(name, sorted(names), n=1)
    return f"; did you mean {close[0]}?" if close else ""


def same_leaf_key(name: str, known) -> str | None:
    """The one known key other than `name` whose last part is `name`'s last part (`max_steps` -> trainer.max_steps,
    `trainer.lr` -> optim.lr); None where none or several are."""
    leaf = name.split(".")[-1]
    found = [k for k in known if k != name and k.split(".")[-1] == leaf]
    return found[0] if len(found) == 1 else None


def unknown_key(key: str, known) -> str:
    """Why `key` is refused: no config file defines it, and the one known key of the same last name if there is one
    (`max_steps` -> trainer.max_steps, `lr` -> optim.lr: the group left out or mistaken), else the closest known key
    or group of its depth (of its own group first: `trainer.max_stepz` -> trainer.max_steps, `atention` ->
    attention), else of any depth."""
    group, depth = key.split(".")[0], key.count(".") + 1
    same_leaf = same_leaf_key(key, known)
    level = {".".join(k.split(".")[:depth]) for k in known}
    hint = (f"; did you mean {same_leaf}?" if same_leaf else
            did_you_mean(key, [k for k in level if k.split(".")[0] == group]) or did_you_mean(key, level)
            or did_you_mean(key, known))
    return f"unknown key (no config file defines it{hint})"


def check_keys(cfg: DictConfig, known: dict[str, set]) -> None:
    for key, value in _leaves(OmegaConf.to_container(cfg, resolve=False)):
        if key not in known:
            _fail(key, value, unknown_key(key, known))


def check_set(cfg: DictConfig) -> None:
    """Mandatory values (`???`) must be set before a run; tools that only read the model's shape skip this."""
    for key, value in _leaves(OmegaConf.to_container(cfg, resolve=False)):
        if value == MISSING:
            hint = " (the folder holding train.zarr and heldout.zarr)" if key == "data.path" else ""
            raise ValueError(f"config: {key} is mandatory and not set: add {key}=<value>{hint}")


# ----- 2. types -------------------------------------------------------------------------------------------
def check_types(cfg: DictConfig, known: dict[str, set]) -> None:
    for key, _ in _leaves(OmegaConf.to_container(cfg, resolve=False)):
        kinds = known.get(key, {"any"})
        if "any" in kinds or key in SELF_CHECKED:
            continue
        value = OmegaConf.select(cfg, key)
        if value is None and key in NULLABLE:
            continue
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        if kinds <= {"int"} and not (numeric and isinstance(value, int)):
            _fail(key, value, "must be an integer")
        if kinds <= {"int", "number"} and not numeric:
            _fail(key, value, "must be a number")
        if kinds == {"bool"} and not isinstance(value, bool):
            _fail(key, value, "must be true or false")
        if kinds == {"list"} and not OmegaConf.is_list(OmegaConf.select(cfg, key)):
            _fail(key, value, "must be a list, e.g. [a,b]")


# ----- 3. values ------------------------------------------------------------------------------------------
def _positive_int(cfg: DictConfig, key: str, allow_none: bool = False) -> None:
    value = OmegaConf.select(cfg, key)
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        _fail(key, value, "must be a positive integer")


def _check_attention(cfg: DictConfig) -> None:
    """The attention's parameters, checked by its own core (models/attention/). The key named is the one the user
    typed: `p` for a top-level shortcut that conf/attention/<name>.yaml interpolates (p: ${p}), else attention.<key>."""
    from longctx.models.attention import AttentionParamError, params_from_conf, parse_params  # torch: on use only

    try:
        parse_params(cfg.attention.name, params_from_conf(cfg.attention))
    except AttentionParamError as err:
        key = f"attention.{err.key}"
        if err.key in cfg.attention and OmegaConf.is_interpolation(cfg.attention, err.key):
            raw = OmegaConf.to_container(cfg.attention, resolve=False)[err.key]   # e.g. "${p}"
            shortcut = re.fullmatch(r"\$\{(\w+)\}", str(raw))
            key = shortcut.group(1) if shortcut else key
        _fail(key, err.value, err.why)


def check_context_parallel(cfg: DictConfig, world_size: int | None = None) -> None:
    """trainer.context_parallel=N: a positive integer dividing ctx (equal slices), an architecture and attention with
    a context-parallel form (models.context_parallel); with the world size known, N divides it and the
    data-parallel ranks (world / N) divide data.docs_per_batch."""
    key = "trainer.context_parallel"
    if "context_parallel" not in cfg.trainer:  # a config saved before the key: no CP
        return
    _positive_int(cfg, key)
    n = cfg.trainer.context_parallel
    if world_size is not None and world_size % n:
        _fail(key, n, f"must divide the world size {world_size} (data-parallel x context-parallel ranks)")
    if world_size is not None and cfg.data.docs_per_batch % (world_size // n):
        _fail("data.docs_per_batch", cfg.data.docs_per_batch, f"must be divisible by the {world_size // n} "
              f"data-parallel ranks (world size {world_size} / {key}={n})")
    if n == 1:
        return
    if cfg.ctx % n:
        _fail(key, n, f"must divide ctx={cfg.ctx} (each rank holds an equal slice of the context)")
    block = cfg.data.get("reshape_block")
    if block is not None and block % n:
        _fail(key, n, f"must divide data.reshape_block={block} (the training sequences' length)")
    from longctx.models import architecture_class
    from longctx.models.attention import attention_class

    if "context_parallel" not in vars(architecture_class(cfg.arch.name)):
        _fail(key, n, f"arch={cfg.arch.name} has no context-parallel form (its recurrence runs over the whole "
                      f"sequence in one process); use arch=gpt2 or {key}=1")
    if not hasattr(attention_class(cfg.attention.name), "context_parallel"):
        _fail(key, n, f"attention={cfg.attention.name} has no context-parallel form; use {key}=1")


def _check_pack(cfg: DictConfig) -> None:
    """data.pack=true: a dataset prepared with --pack (checked on its arrays, train.data.resolve_splits), an
    architecture whose forward takes `doc_ids`, and nothing that cuts the rows (reshape_block, context slices)."""
    pack = cfg.data.get("pack", False)
    if not isinstance(pack, bool):
        _fail("data.pack", pack, "expected true or false")
    if not pack:
        return
    if cfg.data.name in ("icl_markov", "mqar"):
        _fail("data.pack", pack, f"data={cfg.data.name} generates fixed-length documents, with no boundaries to "
                                 f"pack; packing needs a dataset prepared with scripts/prepare_dataset.py --pack")
    if cfg.data.get("reshape_block") is not None:
        _fail("data.pack", pack, f"cannot be combined with data.reshape_block={cfg.data.reshape_block} (it cuts "
                                 f"rows without regard to documents)")
    if cfg.trainer.get("context_parallel", 1) != 1:
        _fail("data.pack", pack, f"cannot be combined with trainer.context_parallel={cfg.trainer.context_parallel}")
    import inspect

    from longctx.models import architecture_class
    if "doc_ids" not in inspect.signature(architecture_class(cfg.arch.name).forward).parameters:
        _fail("data.pack", pack, f"arch={cfg.arch.name} does not take packed documents (no doc_ids in its forward)")


def _check_loss_on(cfg: DictConfig) -> None:
    """data.loss_on: "queries" (MQAR only, its default: the loss at the queried values) or "all" (every target)."""
    from longctx.data.mqar import LOSS_ON

    value = cfg.data.get("loss_on", "all")
    if value not in LOSS_ON:
        _fail("data.loss_on", value, f"expected one of {', '.join(LOSS_ON)}")
    if value == "queries" and cfg.data.name != "mqar":
        _fail("data.loss_on", value, f"only the recall data (data=mqar) marks query positions; data={cfg.data.name} "
                                     f"trains on every target (data.loss_on=all)")
    if value == "queries" and cfg.data.get("reshape_block") is not None:
        _fail("data.loss_on", value, f"query positions are found in whole documents, which data.reshape_block="
                                     f"{cfg.data.reshape_block} cuts (set data.reshape_block=null or data.loss_on=all)")


def validate(cfg: DictConfig, choices: dict | None = None, conf_dir: Path = CONF_DIR, for_run: bool = False) -> None:
    """Check the keys, types and values a typo or a bad sweep can produce (unknown group options never compose:
    launch.check_overrides names them first). `choices`: Hydra's group -> chosen option, when known. `for_run`:
    also require every mandatory value (data.path of data=longcrawl64)."""
    known = schema(conf_dir, choices)
    check_keys(cfg, known)
    if for_run:
        check_set(cfg)
    check_types(cfg, known)
    try:
        check_values(cfg)
    except (ConfigAttributeError, ConfigKeyError) as err:  # a key every run reads, deleted (`~trainer.compile`)
        key = getattr(err, "full_key", None) or str(err).splitlines()[0]
        raise ValueError(f"config: {key}: missing, and every run needs it (deleted with ~{key}?); set it to a "
                         f"value instead") from None


def _finite(cfg: DictConfig, key: str, low: float | None = None, strict: bool = False, allow_none: bool = False):
    """A finite number (not inf/nan, which YAML reads as floats), >= low (> low when strict)."""
    value = OmegaConf.select(cfg, key)
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        _fail(key, value, "must be a finite number" + (" or null" if allow_none else ""))
    if low is not None and (value <= low if strict else value < low):
        _fail(key, value, f"must be {'>' if strict else '>='} {low}" + (" or null" if allow_none else ""))


def check_values(cfg: DictConfig) -> None:
    check_run_name(cfg.run_name)
    for key in ("ctx", "model.d_model", "model.n_layers", "model.n_heads", "model.mlp_ratio",
                "trainer.max_steps", "trainer.eval_every", "trainer.keep_checkpoints", "trainer.icl_bins",
                "data.docs_per_batch", "data.eval_docs", "logger.console_every", "window"):
        _positive_int(cfg, key)
    skips = cfg.trainer.max_skipped_steps
    if isinstance(skips, bool) or not isinstance(skips, int) or skips < 0:
        _fail("trainer.max_skipped_steps", skips, "must be an integer >= 0")
    for key in ("trainer.micro_docs", "trainer.num_threads", "data.reshape_block"):
        _positive_int(cfg, key, allow_none=True)
    if isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int) or not 0 <= cfg.seed < 2**32:
        _fail("seed", cfg.seed, "must be an integer in [0, 2**32)")
    budget = cfg.trainer.flops_budget
    if budget is not None and (isinstance(budget, (bool, str)) or not budget > 0 or not math.isfinite(budget)):
        _fail("trainer.flops_budget", budget, "must be a positive number of FLOPs, or null")
    parse_stop_when(cfg.trainer.get("stop_when"), cfg.data.get("name"))
    if cfg.ctx < 2:
        _fail("ctx", cfg.ctx, "must be at least 2")
    if cfg.model.d_model % cfg.model.n_heads:
        _fail("model.d_model", cfg.model.d_model, f"must be divisible by model.n_heads={cfg.model.n_heads}")
    _check_attention(cfg)
    check_context_parallel(cfg)
    _check_pack(cfg)
    _check_loss_on(cfg)
    if cfg.device not in DEVICES:
        _fail("device", cfg.device, f"expected one of {DEVICES}")
    if cfg.trainer.precision not in PRECISIONS:
        _fail("trainer.precision", cfg.trainer.precision, f"expected one of {PRECISIONS}")
    if cfg.trainer.resume not in RESUME:
        _fail("trainer.resume", cfg.trainer.resume, "expected false, true, auto or null")
    if cfg.trainer.compile not in COMPILE:
        _fail("trainer.compile", cfg.trainer.compile, "expected false, blocks (or true) or model")
    if cfg.trainer.activation_checkpointing not in CHECKPOINTING:
        _fail("trainer.activation_checkpointing", cfg.trainer.activation_checkpointing, "expected false, true or auto")
    if cfg.trainer.on_nonfinite not in ("stop", "skip"):
        _fail("trainer.on_nonfinite", cfg.trainer.on_nonfinite, "expected stop or skip")
    if cfg.logger.wandb.mode not in WANDB_MODES:
        _fail("logger.wandb.mode", cfg.logger.wandb.mode, f"expected one of {WANDB_MODES}")
    optim = cfg.optim
    _finite(cfg, "optim.lr", 0, strict=True)
    _finite(cfg, "optim.min_lr", 0)
    if not optim.min_lr <= optim.lr:
        _fail("optim.min_lr", optim.min_lr, f"must lie in [0, optim.lr={optim.lr}]")
    _finite(cfg, "optim.eps", 0, strict=True)
    _finite(cfg, "optim.weight_decay", 0)
    _finite(cfg, "optim.grad_clip", 0, strict=True, allow_none=True)
    if isinstance(optim.warmup_steps, bool) or not isinstance(optim.warmup_steps, int) or optim.warmup_steps < 0:
        _fail("optim.warmup_steps", optim.warmup_steps, "must be an integer >= 0")
    betas = list(optim.betas)
    if len(betas) != 2 or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1
                                  for b in betas):
        _fail("optim.betas", betas, "expected two values in [0, 1)")


def resolve_resume(resume, multirun: bool, environ=os.environ):
    """trainer.resume=null means auto for a multirun job or a Slurm job, whose launcher relaunches it into
    the same folder after a preemption or time limit (hydra-submitit, `scontrol requeue`), and false for a
    plain run, which never continues an earlier run unless asked."""
    if resume is not None:
        return resume
    return "auto" if multirun or "SLURM_JOB_ID" in environ else False
