"""Checks train.py makes before Hydra writes anything: a Hydra callback (conf/config.yaml, hydra.callbacks) that runs
before Hydra makes the run folder (a plain run) or the sweep folder and its multirun.yaml (a multirun), and the check
of a config that `--cfg` only prints. A failed check is one line on stderr and exit code 2.

- a run: run_name stays inside runs/; the run folder is not a file and can be written;
- a multirun: the same of the sweep folder; a sweep folder that already holds a sweep (multirun.yaml) is relaunched
  only with the same overrides but for the values of its sweep axes (which resumes or adds jobs, each in the folder
  its run name gives); a Slurm launcher needs Slurm (sbatch on PATH).
"""
from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from longctx.naming import hidden_from_name, is_sweep_axis, swept_keys
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


def check_sweep_names(overrides: list[str]) -> None:
    """A multirun's jobs are run in folders named by what they run (hydra.sweep.subdir = the run name): an axis whose
    key the name does not show (trainer.icl_bins, data.eval_docs, ...) would put two jobs in one folder, the second
    resuming the first and saying it had nothing to do. Refused naming the key, unless the subdir is the user's."""
    if "hydra.sweep.subdir" in _by_key(overrides):
        return
    named = swept_keys(overrides)
    for override in overrides:
        key = override.split("=", 1)[0]
        if is_sweep_axis(override) and hidden_from_name(key, named):
            raise ValueError(f"config: {override}: the run names of a sweep do not show {key.lstrip('+~')}, so its "
                             f"jobs would share one run folder (the second resuming the first); launch one sweep per "
                             f"value (each with its own hydra.sweep.dir), or set hydra.sweep.subdir")


def check_no_sweep(overrides: list[str]) -> None:
    """`attention=power,exp` without -m: several values for one run (Hydra's answer spans five lines and points at
    HYDRA_FULL_ERROR). Refused naming it and the flag that sweeps."""
    for override in overrides:
        if is_sweep_axis(override):
            raise ValueError(f"config: {override}: several values are a sweep, which runs with -m "
                             f"(python train.py -m ... {override}); one run takes one value")


BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def sweep_jobs(overrides: list[str], conf_dir: Path) -> list[list[str]] | None:
    """Each job's overrides of a `-m` launch, as Hydra's basic sweeper crosses them: the recipe's hydra.sweeper.params
    and the command line's axes. None where another sweeper runs the grid, or where it does not compose or parse
    (Hydra names why when it launches)."""
    from hydra import initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    try:
        with initialize_config_dir(config_dir=str(Path(conf_dir).resolve()), version_base="1.3"):
            primary = GlobalHydra.instance().hydra.compose_config("config", list(overrides),
                                                                  run_mode=RunMode.MULTIRUN)
        if primary.hydra.sweeper.get("_target_") != BASIC_SWEEPER:
            return None
        params = primary.hydra.sweeper.get("params")
        params = OmegaConf.to_container(params, resolve=True) if params is not None else {}
        parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()] + list(overrides))
        return BasicSweeper.split_arguments(parsed, None)[0]
    except Exception:  # a glob sweep (it needs Hydra's config loader), an option that does not compose: Hydra's
        return None


def check_sweep_jobs(overrides: list[str], conf_dir: Path) -> None:
    """Every job of a `-m` sweep has its config checked as its run will check it (validate), before the first job
    starts: a bad value at the grid's fifth point is named now, in one line with the job's swept values, not after
    four jobs trained (or, under Slurm, when its job starts). A job whose config does not compose is left to Hydra,
    which composes every job before launching any."""
    from hydra import initialize_config_dir

    from longctx.train.config import resolve_resume, validate

    jobs = sweep_jobs(overrides, conf_dir)
    if not jobs or len(jobs) < 2:
        return
    keys = [o.split("=", 1)[0] for o in jobs[0]]
    varying = {k for i, k in enumerate(keys) if len({job[i] for job in jobs}) > 1}  # every job: these keys, in order
    swept = swept_keys(overrides, {k: ",".join(sorted({j[i].split("=", 1)[1] for j in jobs}))
                                   for i, k in enumerate(keys) if k in varying})
    own_subdir = "hydra.sweep.subdir" in _by_key(overrides)
    folders: dict[str, tuple[int, str]] = {}   # run name (each job's folder) -> the first job named so
    with initialize_config_dir(config_dir=str(Path(conf_dir).resolve()), version_base="1.3"):
        for n, job in enumerate(jobs, 1):
            composed = _run_config(job, swept)
            if composed is None:
                continue
            cfg, choices, _ = composed
            shown = " ".join(o for o in job if o.split("=", 1)[0] in varying)
            try:
                cfg.trainer.resume = resolve_resume(cfg.trainer.resume, multirun=True)
                validate(cfg, choices, conf_dir, for_run=True)
            except ValueError as err:
                raise ValueError(f"{err} (sweep job {n} of {len(jobs)}: {shown}); no job was launched") from None
            # two jobs of one name would train in one folder, the second failing on (or resuming) the first's run
            first = folders.setdefault(str(cfg.run_name), (n, shown))
            if first[0] != n and not own_subdir:
                raise ValueError(f"config: sweep jobs {first[0]} ({first[1]}) and {n} ({shown}) of {len(jobs)} are "
                                 f"both named {cfg.run_name}, so they would share one run folder (the name does not "
                                 f"show what tells them apart); launch one sweep per value (each with its own "
                                 f"hydra.sweep.dir), or set hydra.sweep.subdir; no job was launched")


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
            if k in old and old[k] != new[k] and not (is_sweep_axis(old[k]) or is_sweep_axis(new[k]))]
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


def check_overrides(overrides: list[str], conf_dir: Path) -> None:
    """Every override sets a key that a config file defines, or picks an option of a config group that exists
    (each value of a sweep too); else ValueError naming it and the closest valid name. Hydra's own answers span
    several lines, and for a mistyped key advise adding `+`, which only adds the typo. A key counts if any option
    of any group defines it (the composed config's keys are checked again by validate); `hydra.*`, Hydra's
    groups and `group@package` overrides are left to Hydra."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from longctx.train.config import schema, unknown_key

    parser, known, texts = OverridesParser.create(), None, {}
    searchpath = any(o.lstrip("+~").startswith("hydra.searchpath") for o in overrides)  # options from elsewhere
    for item in overrides:
        try:
            override = parser.parse_overrides([item])[0]
        except Exception:  # Hydra's parse errors span several lines
            quote = (" -- a value holding =, < or > needs quotes that reach Hydra: in a shell, "
                     "\"trainer.stop_when='recall_accuracy>=0.99'\"") if any(c in item.partition("=")[2] for c in "=<>") \
                else ""
            raise ValueError(f"config: {item!r}: not an override (expected key=value, group=option, +key=value or "
                             f"~key){quote}") from None
        name = override.key_or_group
        if name.split("/")[0].split(".")[0] == "hydra" or override.package is not None:
            continue
        if (conf_dir / name).is_dir():
            if not searchpath:
                _check_options(override, conf_dir)
            continue
        known = known if known is not None else schema(conf_dir)
        if not _defined(name, known):
            raise ValueError(f"config: {item.lstrip('+')}: {unknown_key(name, known)}")
        if override.is_delete():
            continue
        _check_chosen_option_has(name, item, overrides, conf_dir)   # `+key` too: nothing would read it
        if override.is_add() or override.is_force_add():
            continue
        _check_read(name, item, overrides, conf_dir, texts)


def _check_chosen_option_has(key: str, item: str, overrides: list[str], conf_dir: Path) -> None:
    """`data.path=/x` under data=icl_markov: a key of another option of the group (Hydra would only say to add `+`).
    Checked when the chosen option is plain to see: on the command line or conf/config.yaml's default, with no
    experiment (whose recipes pick options of their own)."""
    from longctx.train.config import schema

    group = key.split(".")[0]
    if not (conf_dir / group).is_dir():
        return
    chosen = _chosen_option(group, overrides, conf_dir)
    # no experiment is picked here (_chosen_option): the keys its recipes set globally are not the option's
    unpicked = {group.relative_to(conf_dir).as_posix(): None for group in [conf_dir / "experiment",
                                                                           *conf_dir.glob("experiment/**")]
                if group.is_dir()}
    if chosen is None or _defined(key, schema(conf_dir, {**unpicked, group: chosen})):
        return
    having = [path.stem for path in sorted((conf_dir / group).glob("*.yaml"))
              if _defined(key, schema(conf_dir, {**unpicked, group: path.stem}))]
    if not having:   # only an experiment's recipe sets it
        raise ValueError(f"config: {item}: {group}={chosen} has no key {key[len(group) + 1:]} (only experiments set "
                         f"it: pick one with experiment=NAME)")
    raise ValueError(f"config: {item}: {group}={chosen} has no key {key[len(group) + 1:]} (only {group}="
                     f"{', '.join(having)}; pick one, e.g. {group}={having[0]} {item})")


def _check_read(key: str, item: str, overrides: list[str], conf_dir: Path, texts: dict) -> None:
    """A top-level key that only some options of one group read (`${p}` in attention/power.yaml): `p=3` with
    attention=exp, an option that does not read it, would change nothing but the run's name; `p=2 attention.p=3`
    sets it twice, the group's value winning unseen (the run's config showing both). texts: the config files' texts
    by path, read on the first call of a command line and kept for the others."""
    if "." in key or not (conf_dir / "config.yaml").exists():
        return
    found = _key_readers(key, conf_dir, texts)
    if found is None:
        return
    group, options = found
    chosen = _chosen_option(group, overrides, conf_dir)
    if chosen is not None and chosen not in options:
        raise ValueError(f"config: {item}: {group}={chosen} does not read {key} (only {group}="
                         f"{', '.join(options)} does); add {group}={options[0]}, or leave {key} out")
    inner = f"{group}.{key}"
    other = next((o for o in overrides if o.lstrip("+").partition("=")[0] == inner), None)
    if other is not None:
        raise ValueError(f"config: {item} and {other}: both set {key} ({inner} reads {key}: {group}/"
                         f"{options[0]}.yaml), and {inner} would win unseen; give one of them")


def _key_readers(key: str, conf_dir: Path, texts: dict) -> tuple[str, list[str]] | None:
    """The one config group (not experiment) whose options read top-level `key` as `${key}`, and those options with
    the ones extending them; None when no single group does. texts: the config files' texts, read once and kept."""
    if not texts:
        texts.update((path, path.read_text()) for path in sorted(conf_dir.rglob("*.yaml")))
    readers = [path for path, text in texts.items() if "${" + key + "}" in text]
    groups = {path.parent.relative_to(conf_dir).as_posix() for path in readers}
    if len(groups) != 1 or "/" in next(iter(groups)) or next(iter(groups)) in (".", "experiment"):
        return None
    group = next(iter(groups))
    return group, _options_reading({path.stem for path in readers}, conf_dir / group)


def _options_reading(readers: set[str], group_dir: Path) -> list[str]:
    """The options of a group that read a key: those whose file names it (`readers`) and those whose defaults list
    composes one of them (data/icl_markov_long.yaml extends icl_markov, which reads `${cache_dir}`)."""
    extends = {}
    for path in sorted(group_dir.glob("*.yaml")):
        defaults = OmegaConf.load(path).get("defaults") if path.read_text().strip() else None
        extends[path.stem] = {str(entry) for entry in defaults or [] if isinstance(entry, str)}
    found, grew = set(readers), True
    while grew:
        grew = False
        for option, parents in extends.items():
            if option not in found and parents & found:
                found.add(option)
                grew = True
    return sorted(found)


def check_under_experiment(overrides: list[str], conf_dir: Path) -> None:
    """With an experiment picked, the options its recipe composes are known only once composed, so check_overrides
    leaves two mistakes to this: a key the composed option lacks (`experiment=icl_small data.path=/x`: Hydra's
    several lines) and a top-level key it does not read (`experiment=recall_state p=3` runs its softmax arm, p
    unused). Both are refused naming the option the experiment composes. One run only: a sweep's jobs differ."""
    from hydra import compose, initialize_config_dir

    picked = _by_key(overrides)
    if picked.get("experiment", "null").partition("=")[2] in ("", "null") \
            or any(o.lstrip("+~").split("=")[0].split(".")[0] == "hydra" and "searchpath" in o for o in overrides):
        return
    options = [o for o in overrides if (conf_dir / o.lstrip("+~").split("=")[0].split("@")[0]).is_dir()]
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            cfg = compose("config", overrides=options, return_hydra_config=True)
    except Exception:
        return  # the options themselves do not compose: Hydra says why
    choices = cfg.hydra.runtime.choices
    composed = OmegaConf.to_container(cfg, resolve=False)
    composed.pop("hydra", None)
    experiment = f"experiment={choices.get('experiment')}"
    texts: dict = {}
    for item in overrides:
        key, _, _ = item.partition("=")
        if key.startswith(("+", "~")) or item in options or key.split(".")[0] == "hydra" or "@" in key:
            continue
        if not _has_key(composed, key):
            group = key.split(".")[0]
            raise ValueError(f"config: {item}: {experiment} composes {group}={choices.get(group)}, which has no key "
                             f"{key[len(group) + 1:]}; pick another {group} with it, or leave {key} out")
        found = _key_readers(key, conf_dir, texts) if "." not in key else None
        if found is not None and "${" + key + "}" not in _strings(composed, skip=key):
            group, readers = found
            raise ValueError(f"config: {item}: {experiment} composes {group}={choices.get(group)}, which does not "
                             f"read {key} (only {group}={', '.join(readers)} does); add {group}={readers[0]}, "
                             f"or leave {key} out")


def _has_key(container: dict, key: str) -> bool:
    """Whether a dotted key names a node of a composed config (its value may be unset, `???`)."""
    node = container
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _strings(node, skip: str) -> str:
    """Every string value of a config container (top-level `skip` left out), joined: where `${key}` is looked for."""
    if isinstance(node, dict):
        return "\n".join(_strings(value, "") for key, value in node.items() if key != skip)
    if isinstance(node, list):
        return "\n".join(_strings(value, "") for value in node)
    return node if isinstance(node, str) else ""


def _chosen_option(group: str, overrides: list[str], conf_dir: Path) -> str | None:
    """The option of `group` a run composes, when plain: a single `group=option`, else the default of
    conf/config.yaml; None when an experiment may pick another or a sweep varies it."""
    picked = {o.split("=", 1)[0].lstrip("+~"): o.split("=", 1)[1] for o in overrides if "=" in o}
    if picked.get("experiment", "null") != "null" or any(k.startswith("experiment/") for k in picked):
        return None
    if group in picked:
        value = picked[group]
        return value if (conf_dir / group / f"{value}.yaml").exists() else None
    for entry in OmegaConf.load(conf_dir / "config.yaml").get("defaults") or []:
        if isinstance(entry, DictConfig) and group in entry:
            return entry[group]
    return None


def _defined(key: str, known) -> bool:
    """A key of a config file, a node holding some (`optim`, `logger.wandb`), or a key inside one (a dict value)."""
    parts = key.split(".")
    return (key in known or any(k.startswith(key + ".") for k in known)
            or any(".".join(parts[:i]) in known for i in range(1, len(parts))))


def _check_options(override, conf_dir: Path) -> None:
    from longctx.train.config import did_you_mean

    group = override.key_or_group
    if override.is_sweep_override():
        if "glob" in override.value_type.name.lower():
            return  # a glob picks among the options that exist
        values = list(override.sweep_string_iterator())
    else:
        value = override.value()
        values = value if isinstance(value, list) else [value]
    options = sorted(p.relative_to(conf_dir / group).with_suffix("").as_posix()
                     for p in (conf_dir / group).rglob("*.yaml"))
    for value in values:
        if value is None or isinstance(value, dict) or str(value) in (*options, "null"):
            continue
        raise ValueError(f"config: {group}={value}: no such {group} option{did_you_mean(str(value), options)} "
                         f"(options: {', '.join(o for o in options if '/' not in o)})")


def _check_dashed_keys(argv: list[str], conf_dir: Path) -> None:
    """`--ctx 512`, `--trainer.max_steps=5` or `--max-steps 5`: a config key typed as an option (Hydra's parser only
    says `unrecognized arguments`) is named with the override it means, in one line."""
    from longctx.train.config import same_leaf_key, schema

    known = schema(conf_dir)
    for i, item in enumerate(argv):
        if not item.startswith("--") or item == "--":
            continue
        name, sep, value = item[2:].partition("=")
        key = name.replace("-", "_")
        if key not in known and not (conf_dir / key).is_dir():  # `--max-steps`: the one key of that last name
            key = same_leaf_key(key, known)
        if key is not None:
            if not sep and i + 1 < len(argv) and not argv[i + 1].startswith("-") and "=" not in argv[i + 1]:
                value = argv[i + 1]
            fail(f"config: {item}: overrides are key=value, without dashes: {key}={value or '<value>'}")


def check_command_line(argv: list[str], conf_dir: Path) -> list[str]:
    """train.py's arguments, checked before Hydra sees them: its overrides (check_overrides), and the config that
    `--cfg` prints. Returns them, with `--resolve` added to `--cfg job` / `--cfg all`, so that the printed config
    shows the values a run gets (`p: 2`, the run name) rather than their `${...}` interpolations."""
    from hydra._internal.utils import get_args_parser

    try:
        with contextlib.redirect_stderr(io.StringIO()):  # Hydra parses again and reports it: its usage once, not twice
            args = get_args_parser().parse_args(argv)
    except SystemExit:
        _check_dashed_keys(argv, conf_dir)
        return argv  # Hydra's own parser reports it
    if args.help or args.hydra_help or args.info is not None or args.shell_completion:
        return argv
    try:
        check_overrides(list(args.overrides), conf_dir)
        if args.multirun:
            check_sweep_names(list(args.overrides))
            if not args.cfg:
                check_sweep_jobs(list(args.overrides), conf_dir)
        else:
            check_no_sweep(list(args.overrides))
            check_under_experiment(list(args.overrides), conf_dir)
    except ValueError as err:
        fail(str(err))
    if args.cfg:
        run_dir = check_shown_config(list(args.overrides), conf_dir, args.multirun)
        # run_dir is Hydra's output folder, which --cfg never makes (it would print null): show where a run would go
        quotable = run_dir and not any(c in run_dir for c in ("'", "\\", "${"))
        if quotable and "run_dir" not in _by_key(args.overrides) and args.cfg in ("job", "all"):
            # beside the other overrides (argparse takes them as one run of positionals: `a=1 --cfg job` and
            # `--cfg job a=1` alike)
            at = argv.index(args.overrides[0]) if args.overrides and args.overrides[0] in argv else len(argv)
            argv = [*argv[:at], f"run_dir='{run_dir}'", *argv[at:]]
    if args.cfg in ("job", "all") and not (args.resolve or args.multirun):
        argv = [*argv, "--resolve"]
    return argv


def check_shown_config(overrides: list[str], conf_dir: Path, multirun: bool = False) -> str | None:
    """`python train.py --cfg job ...` prints the config without running anything: check it first, as a run would
    (keys, types, values), so a bad value is named instead of printed. Returns the folder a run would write
    (hydra.run.dir, absolute, with the run name these overrides give), None for a multirun or a config that does
    not compose."""
    if multirun:
        return None
    from hydra import initialize_config_dir

    from longctx.train.config import validate

    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        composed = _run_config(overrides)
    if composed is None:
        return None  # a composition error: Hydra reports it as it prints
    cfg, choices, run_dir = composed
    try:
        validate(cfg, choices)
    except ValueError as err:
        fail(str(err))
    return run_dir


def _run_config(overrides: list[str], swept: set[str] | None = None) -> tuple[DictConfig, dict, str | None] | None:
    """Inside an initialized Hydra: (the config a run of these overrides gets, without its hydra node and with its
    run name resolved; the groups' chosen options; the folder it would write, _run_folder), or None where the
    overrides do not compose (Hydra reports that itself). swept: as _run_folder's."""
    from hydra import compose

    try:
        cfg = compose("config", overrides=list(overrides), return_hydra_config=True)
    except Exception:
        return None
    run_dir = _run_folder(cfg, overrides, swept)
    choices = {g: o for g, o in cfg.hydra.runtime.choices.items() if "/" not in g}
    OmegaConf.set_struct(cfg, False)
    cfg.pop("hydra")
    return cfg, choices, run_dir


def _run_folder(cfg: DictConfig, overrides: list[str], swept: set[str] | None = None) -> str | None:
    """hydra.run.dir of a composed config, absolute: the run name interpolated there is the one these overrides give
    (composed outside a running Hydra, `${longctx.run_name:}` would see no overrides and drop their suffixes).
    swept: the keys a multirun sweeps (naming.swept_keys), for a job of one."""
    from longctx.naming import SUFFIX_RESOLVER, given_overrides, job_swept_keys, run_name

    swept = job_swept_keys() if swept is None else swept
    try:
        raw = str(OmegaConf.to_container(cfg, resolve=False).get("run_name"))
        if "longctx.run_name" in raw:
            cfg.run_name = run_name(cfg, overrides, swept)
        elif SUFFIX_RESOLVER in raw:  # a recipe's own name: its suffix read from these overrides
            with given_overrides(overrides, swept):
                cfg.run_name = str(cfg.run_name)
        return os.path.abspath(str(cfg.hydra.run.dir))
    except Exception:  # an interpolation only a running Hydra resolves
        return None
