"""Run names derived from what runs, for run folders, sweep folders and wandb.

    ${longctx.run_name:}  ->  gpt2_power_p2_d64l3_icl_markov_ctx512_s0[_<overrides the name does not show>]

Parts: the architecture, the attention's tag (its degree or window), the model's shape `d<d_model>l<n_layers>`
(read from model.*, so `model.d_model=32` is never called by a preset's name), the data (an ICL task's tag; a
prepared dataset's own folder name, so a dataset prepared into data/pages is `pages`, not `longcrawl64`), ctx and
seed. Every other command-line override that changes what is trained (optim.lr=1e-3, attention.gating=false,
data.docs_per_batch=8) is appended as `<last key part><value>`, sorted by key, so the jobs of any sweep get
distinct names and a relaunch with the same overrides (in any order) lands in the same folder. Overrides that
change only how or how long it runs (trainer.max_steps, logger.*, device, ...) are left out: raising max_steps
continues the same run. A multirun that sweeps trainer.max_steps or trainer.flops_budget (`trainer.max_steps=5,10`,
or the sweeper's params) trains one run per value, so there they are appended (`_max_steps5`): without them the jobs
would share one folder, the second resuming the first.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

RESOLVER = "longctx.run_name"
# `${longctx.name_part:rb,${data.reshape_block}}` in a recipe's own run_name: `_rb1024`, or nothing when null
PART_RESOLVER = "longctx.name_part"
# `${longctx.name_suffix:KEY,...}` ending a recipe's own run_name: the overrides its parts (and the KEYs) do not show
SUFFIX_RESOLVER = "longctx.name_suffix"

# Override keys the name already shows, or that do not change what is trained (prefixes end with a dot).
NOT_IN_SUFFIX = (
    "arch", "attention", "p", "window", "attention.p", "attention.window", "model", "model.name", "model.d_model",
    "model.n_layers", "data", "data.tag", "data.n_pairs", "data.path", "data.cache_dir", "data.eval_docs",
    "data.n_heldout", "ctx", "seed", "run_name",
    "run_dir", "cache_dir", "device", "experiment", "hydra.", "logger.", "trainer.max_steps", "trainer.eval_every",
    "trainer.resume", "trainer.num_threads", "trainer.compile", "trainer.keep_checkpoints", "trainer.micro_docs",
    "trainer.activation_checkpointing", "trainer.icl_bins", "trainer.on_nonfinite", "trainer.max_skipped_steps",
    "trainer.flops_budget", "trainer.context_parallel", "trainer.stop_when",
)
# Keys of NOT_IN_SUFFIX that name the jobs of a sweep over them (a run length: each value its own run)
SWEEP_NAMED = ("trainer.max_steps", "trainer.flops_budget", "trainer.stop_when")
# Keys of NOT_IN_SUFFIX the name's base shows (run_name: arch, attention tag, model, data, ctx, seed)
SHOWN_BY_BASE = ("arch", "attention", "p", "window", "attention.p", "attention.window", "model", "model.name",
                 "model.d_model", "model.n_layers", "data", "data.tag", "data.n_pairs", "data.path", "ctx", "seed")
# the SWEEP_NAMED keys a grid of plain runs varies (scripts/run_points.py sets it for its points): named as in a
# multirun, so two points of different lengths never share a folder
SWEPT_ENV = "LONGCTX_SWEPT_KEYS"
MAX_SUFFIX = 120  # characters of the override suffix kept whole (the base name takes up to ~100 more)


def data_name(data: DictConfig) -> str:
    """The data part of a name: a prepared dataset's folder name unless data.tag was changed from the group's
    `longcrawl64`; a generated task's tag."""
    if data.name == "icl_markov" or data.tag != "longcrawl64":
        return str(data.tag)
    path = OmegaConf.select(data, "path", throw_on_missing=False, default=None)
    if path is None or OmegaConf.is_missing(data, "path"):
        return str(data.tag)
    folder = Path(str(path)).expanduser()
    return folder.name or folder.resolve().name or str(data.tag)  # "." -> the folder's own name


def _named(key: str, swept=()) -> bool:
    key = key.lstrip("+~")
    if key in swept:
        return False
    return "/" in key or any(key == k or (k.endswith(".") and key.startswith(k)) for k in NOT_IN_SUFFIX)


def hidden_from_name(key: str, swept=()) -> bool:
    """Whether a key's value shows nowhere in a run's name (two runs apart only in it share one folder)."""
    bare = key.lstrip("+~")
    return _named(key, swept) and "/" not in bare and bare not in SHOWN_BY_BASE


def override_suffix(overrides: list[str], swept=(), shown: tuple | None = None) -> str:
    """`_lr0.001_gatingfalse` from ["optim.lr=0.001", "attention.gating=false", "ctx=64"]: the overrides that the
    name's other parts do not show, sorted by key; characters a folder name should not hold become '-'. `swept`:
    keys of SWEEP_NAMED that the sweep varies, shown too. `shown`: the keys a recipe's own name shows besides its
    arch, attention, data, ctx and seed (recipe_suffix); its model part is the preset's label, so an override of
    model.d_model or model.n_layers is appended there."""
    parts = []
    for item in sorted(o for o in overrides if "=" in o):
        key, value = item.split("=", 1)
        bare = key.lstrip("+~")
        if shown is not None and bare in shown:
            continue
        if _named(key, swept) and (shown is None or bare not in ("model.d_model", "model.n_layers")):
            continue
        parts.append(re.sub(r"[^A-Za-z0-9._\-]+", "-", key.lstrip("+~").split(".")[-1] + value).strip("-"))
    suffix = "".join(f"_{p}" for p in parts if p)
    if len(suffix) > MAX_SUFFIX:   # a folder name holds 255 bytes: a long tail (paths in values) becomes its digest,
        # the same for the same overrides, so a relaunch still finds its folder
        digest = hashlib.sha1(suffix.encode()).hexdigest()[:12]
        suffix = suffix[:MAX_SUFFIX - len(digest) - 1].rstrip("_-") + "_" + digest
    return suffix



_GIVEN: list = []  # (overrides, swept) that name a config composed outside a Hydra job (given_overrides)


@contextlib.contextmanager
def given_overrides(overrides: list[str], swept=()):
    """Within it, a recipe's `${longctx.name_suffix:...}` reads these overrides instead of a Hydra job's: for a
    config composed outside one (`train.py --cfg job` shows the folder a run would get)."""
    _GIVEN.append((list(overrides), set(swept)))
    try:
        yield
    finally:
        _GIVEN.pop()


def task_overrides() -> list[str]:
    """This job's command-line overrides, from Hydra (empty outside a Hydra job, e.g. hydra.compose in a test)."""
    from hydra.core.hydra_config import HydraConfig

    if _GIVEN:
        return _GIVEN[-1][0]
    if not HydraConfig.initialized():
        return []
    return list(HydraConfig.get().overrides.task)


def is_sweep_axis(override: str) -> bool:
    """A sweep axis (`seed=0,1,2`, `range(...)`, `choice(...)`): its values name jobs, each in its own folder. Read by
    Hydra's own override parser (a list `[a,b]`, a dict or a quoted string holding commas is one value); an override
    it cannot parse falls back to the commas in its value."""
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser
        return bool(OverridesParser.create().parse_overrides([override])[0].is_sweep_override())
    except Exception:  # Hydra reports a bad override itself, later
        value = override.split("=", 1)[1] if "=" in override else ""
        return "," in value.replace("\\,", "") or value.startswith(("range(", "choice(", "glob("))


def swept_keys(sweep_overrides: list[str], sweeper_params: dict | None = None) -> set[str]:
    """The keys of SWEEP_NAMED that a multirun varies: on its command line (`trainer.max_steps=5,10`, range(...))
    or in its sweeper's params."""
    swept = {o.split("=", 1)[0].lstrip("+~") for o in sweep_overrides if is_sweep_axis(o)}
    swept |= {k for k, v in (sweeper_params or {}).items() if is_sweep_axis(f"{k}={v}")}
    return swept & set(SWEEP_NAMED)


def job_swept_keys() -> set[str]:
    """swept_keys of the multirun this Hydra job belongs to (its sweep folder's multirun.yaml, written before any
    job starts); outside a multirun, those SWEPT_ENV names (a point of scripts/run_points.py's grid), else none."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return set(os.environ.get(SWEPT_ENV, "").split(",")) & set(SWEEP_NAMED)   # a point of run_points' grid
    return sweep_folder_swept_keys(Path(str(HydraConfig.get().sweep.dir)))


def sweep_folder_swept_keys(sweep_dir: Path) -> set[str]:
    """swept_keys of every launch into a sweep folder (multirun.yaml and the earlier launches' multirun.launch<N>.yaml):
    a relaunch of one value of a swept run length (`trainer.max_steps=4` after `=2,4`) still names it, and so
    resumes `_max_steps4` rather than training a copy under the bare name. No record (a launcher that writes none):
    none, the job's own overrides name it."""
    swept = set()
    for record in [sweep_dir / "multirun.yaml", *sorted(sweep_dir.glob("multirun.launch*.yaml"))]:
        try:
            saved = OmegaConf.load(record).hydra   # OmegaConf.load reads YAML safely (no code runs)
            overrides = [str(o) for o in saved.overrides.task]
            params = OmegaConf.to_container(saved.sweeper.params) if OmegaConf.select(saved, "sweeper.params") else {}
        except Exception:
            continue
        swept |= swept_keys(overrides, params)
    return swept


def run_name(cfg: DictConfig, overrides: list[str] | None = None, swept=None) -> str:
    model = f"d{cfg.model.d_model}l{cfg.model.n_layers}"
    base = f"{cfg.arch.name}_{cfg.attention.tag}_{model}_{data_name(cfg.data)}_ctx{cfg.ctx}_s{cfg.seed}"
    if overrides is None:
        overrides, swept = task_overrides(), job_swept_keys() if swept is None else swept
    return base + override_suffix(overrides, swept or ())


def _resolve(*, _root_: DictConfig) -> str:
    return run_name(_root_)


def recipe_suffix(*shown: str) -> str:
    """`${longctx.name_suffix:model.name,data.docs_per_batch,...}` at the end of a recipe's own run_name: the overrides
    its other parts do not show (override_suffix), so `experiment=icl_small optim.lr=1e-3` and its lr=3e-3 point
    are two runs in two folders, as under the default name."""
    swept = _GIVEN[-1][1] if _GIVEN else job_swept_keys()
    return override_suffix(task_overrides(), swept, shown=tuple(str(key) for key in shown))


def name_part(prefix: str, value) -> str:
    """`_<prefix><value>` for a part of a run name, or "" when the value is null (unset): a recipe's run_name shows
    data.reshape_block or trainer.flops_budget only where it is set, never as `_rbNone`."""
    return "" if value is None else f"_{prefix}{value}"


def register() -> None:
    """Make `${longctx.run_name:}` and `${longctx.name_part:PREFIX,VALUE}` known to OmegaConf (done on
    `import longctx`)."""
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, _resolve, use_cache=False)
    if not OmegaConf.has_resolver(PART_RESOLVER):
        OmegaConf.register_new_resolver(PART_RESOLVER, name_part)
    if not OmegaConf.has_resolver(SUFFIX_RESOLVER):
        OmegaConf.register_new_resolver(SUFFIX_RESOLVER, recipe_suffix, use_cache=False)
