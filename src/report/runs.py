"""Runs as the report sees them: found, read (tolerating a run still writing), labelled by what differs between
their configs, grouped by seed and by heldout data."""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from longctx.models.attention import CONF_ONLY_KEYS, attention_class
from longctx.report.evaldata import data_items
from longctx.eval.records import loss_digest
from longctx.report.stats import DocBins, load_doc_bins
from longctx.train.stop_when import parse_stop_when

log = logging.getLogger("longctx.report")

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
CONF_GROUPS = ("arch", "attention", "data", "model", "optim", "trainer", "logger")
# keys that only name outputs or where files live, or mirror another key: never a difference between runs
IGNORED_KEYS = {"run_dir", "run_name", "cache_dir", "data.cache_dir", "data.path", "device", "p", "window",
                "attention.tag", "trainer.resume", "trainer.keep_checkpoints", "trainer.num_threads"}
IGNORED_PREFIXES = ("logger.", "hydra.")
# how often a run evaluated and checkpointed (logger.* and trainer.keep_checkpoints are IGNORED_KEYS): never what a
# label says, unless it is all that tells two runs apart (label_runs)
CADENCE_KEYS = {"trainer.eval_every"}
# data keys that change how training reads the data, not which heldout documents the evaluation sees
# (data.id covers the training split too: the heldout documents are compared by their own digest)
TRAINING_ONLY_DATA_KEYS = {"data.docs_per_batch", "data.reshape_block", "data.train_tokens", "data.id"}
UNSET = "(unset)"


@dataclass
class Run:
    path: Path
    config: dict
    records: list[dict]
    flat: dict = field(default_factory=dict)   # the flattened config, defaults filled in
    name: str = ""        # its folder, with as many parent folders as tell it from the other runs
    label: str = ""       # its attention and every config key that differs from another run's
    seed_label: str = ""  # the label without the seed: runs sharing it differ only in their seed
    status: str = "complete"
    eval_items: tuple = ()   # (key, value) items telling its heldout documents apart beyond the config (evaldata)
    group_key: tuple = ()    # the full config but the seed: runs sharing it (and the label) are seeds of one group
    last_launch: dict = field(default_factory=dict)  # the flattened config of its newest resume (none: {})
    packed_said: bool = field(default=False, repr=False, compare=False)  # the packed-rows warning given
    source: str = "metrics.jsonl"  # the file its records were read from (a report record's, for runs_from_record)
    provenance: dict | None = field(default=None, repr=False)  # its provenance.json as written (None: none)
    code: str | None = None   # a record's run: the code of its launches as the record keeps it (launches_code)

    @property
    def attention(self) -> str:
        return self.config["attention"]["name"]

    @property
    def tag(self) -> str:
        return self.config["attention"].get("tag", self.attention)

    @property
    def ctx(self) -> int:
        return int(self.config["ctx"])

    @property
    def seed(self):
        return self.flat.get("seed")

    @property
    def final(self) -> dict:
        return self.records[-1]

    @property
    def heldout_key(self) -> tuple:
        """Runs sharing it were evaluated on the same heldout documents with the same bins (their optimum is one)."""
        return (self.ctx,) + tuple(sorted((k, _hashable(v)) for k, v in self.flat.items()
                                          if k.startswith("data.") and k not in TRAINING_ONLY_DATA_KEYS)) \
            + self.eval_items

    def at_flops(self, budget: float | None) -> dict | None:
        """The last evaluation within `budget` training FLOPs, every stage before counted (the final one when budget
        is None)."""
        if budget is None:
            return self.final
        within = [r for r in self.records if training_flops(r, float("inf")) <= budget]
        return within[-1] if within else None

    def doc_bins(self, record: dict) -> DocBins | None:
        """The evaluation's per-document record (None when it wrote none)."""
        if not record.get("doc_bins"):
            return None
        name, _, prefix = str(record["doc_bins"]).partition("#")  # FILE.npz#r3_: run 3's arrays of a record
        path = self.path / name
        if not path.exists():
            log.warning(f"warning: {path}: named by {self.source} (step {record['step']}) but missing; "
                        f"no interval for that evaluation")
            return None
        docs = load_doc_bins(path, prefix)
        if not docs.packed:
            check_doc_bins(docs, record, f"{path}" + (f" ({prefix.rstrip('_')})" if prefix else ""), self.source)
        if docs.packed:  # each row's bin means cannot give the trainer's per-position means (their band would be
            if not self.packed_said:  # another quantity's): the run is tabled and drawn without one
                self.packed_said = True
                log.warning(f"warning: {self.name}: evaluated on rows of packed documents; its curve averages each "
                            f"position over the documents reaching it, which the per-row record cannot resample: "
                            f"no interval for this run")
            return None
        return docs


def check_doc_bins(docs: DocBins, record: dict, where: str, source: str) -> None:
    """ValueError naming the file when a per-document record is not its evaluation's: its bins are not the record's
    icl_curve bins, or its means over documents are not the curve (the trainer writes both from one evaluation; a
    file copied over from another run or step would lend its numbers to this one's intervals)."""
    curve = record["icl_curve"]
    edges = [[int(a), int(b)] for a, b, _ in curve]
    if docs.edges.tolist() != edges:
        raise ValueError(f"{where}: its bins {docs.edges.tolist()[:3]}... are not {source}'s icl_curve bins at step "
                         f"{record['step']} ({edges[:3]}...): not this evaluation's per-document record")
    digest = record.get("doc_bins_digest")   # records written before it was kept have none
    if digest is not None and loss_digest(docs.loss) != digest:
        raise ValueError(f"{where}: its losses are not those {source}'s evaluation at step {record['step']} wrote "
                         f"(digest {loss_digest(docs.loss)}, the record says {digest}): the file was replaced")
    means = docs.loss.mean(axis=0)
    losses = np.array([v for *_, v in curve], dtype=np.float64)
    off = ~np.isclose(means, losses, rtol=1e-4, atol=1e-6, equal_nan=True)
    if off.any():
        i = int(np.flatnonzero(off)[0])
        raise ValueError(f"{where}: its mean over documents in bin {edges[i]} is {means[i]:.6g}, where {source}'s "
                         f"icl_curve at step {record['step']} says {losses[i]:.6g}: not this evaluation's per-document "
                         f"record (copied over from another run or step?)")


def training_flops(record: dict, default=None):
    """The training FLOPs behind an evaluation's weights, every stage before included (records older than
    `flops_all_stages` hold their own stage's `flops` only)."""
    return record.get("flops_all_stages", record.get("flops", default))


# ----- loading ----------------------------------------------------------------------------------------------

def _walk_run_folders(path: Path) -> list[Path]:
    """Every folder at and below `path` holding metrics.jsonl or train.log, in path order. Linked folders are followed
    (a sweep assembled from links to its runs), each real folder once (a link back up the tree is not walked again)."""
    out, seen = [], set()
    for root, dirs, files in os.walk(path, followlinks=True):
        real = os.path.realpath(root)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        dirs.sort()
        if "metrics.jsonl" in files or "train.log" in files:
            out.append(Path(root))
    return sorted(out)


def _run_folders(paths: list[Path]) -> tuple[list[Path], list[Path]]:
    """(run folders holding metrics.jsonl, run folders with train.log and config.yaml but no metrics.jsonl yet) among
    `paths` and below them, from one walk of each path. A staged run's earlier stages (and the staged run's own
    folder, whose stages are the runs) are neither."""
    evaluated, unevaluated = [], []
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such run or sweep directory")
        if (path / "metrics.jsonl").exists():
            evaluated.append(path)
            continue
        for run in _walk_run_folders(path):
            if earlier_stage(run):
                continue
            if (run / "metrics.jsonl").exists():
                evaluated.append(run)
            elif not (run / "stages.json").exists() and (run / "config.yaml").exists():
                unevaluated.append(run)
    return evaluated, unevaluated


def find_runs(paths: list[Path]) -> list[Path]:
    """Run directories (holding metrics.jsonl) among `paths` and below them (linked folders followed), in path order,
    each once."""
    runs = list(dict.fromkeys(p.resolve() for p in _run_folders(paths)[0]))
    if not runs:
        raise FileNotFoundError(f"no metrics.jsonl under {', '.join(str(p) for p in paths)}: nothing to report")
    return runs


def unevaluated_runs(paths: list[Path]) -> list[Path]:
    """Run folders (train.log and config.yaml) among `paths` and below them that find_runs leaves out for having no
    metrics.jsonl: stopped, or still running, before their first evaluation. A staged run's own folder (its stages
    are the runs) and its earlier stages are not runs of their own."""
    return list(dict.fromkeys(_run_folders(paths)[1]))


def run_stages(run: Path) -> list[dict]:
    """The stages ({"dir", "overrides"}) of the staged run (trainer.stages) that `run` is a stage of, in order ([]
    for a plain run): the run folder's stages.json lists them."""
    index = run.parent / "stages.json"
    if not index.is_file():
        return []
    try:
        stages = json.loads(index.read_text())["stages"]
        dirs = [s["dir"] for s in stages]
    except (ValueError, KeyError, TypeError, OSError):
        return []
    return stages if run.name in dirs else []


def stage_dirs(run: Path) -> list[str]:
    """The stage folders of the staged run that `run` is a stage of, in order ([] for a plain run)."""
    return [s["dir"] for s in run_stages(run)]


def earlier_stage(run: Path) -> bool:
    """True for a stage of a staged run (trainer.stages) other than its last: the run's result is its last stage's,
    so a sweep's report compares final stages only."""
    dirs = stage_dirs(run)
    return bool(dirs) and run.name != dirs[-1]


def own_stage_source(run: Path, init_from) -> str | None:
    """'stage <dir>' when `init_from` is an earlier stage of the same staged run (its sibling folder), else None.
    The stage's path differs from seed to seed; the fact that the weights came from the run's own stage does not,
    so seeds of a staged point group together while runs started from other sources stay apart."""
    if not init_from:
        return None
    source = Path(str(init_from))
    dirs = stage_dirs(run)
    if source.name in dirs and source.name != run.name and source.parent.name == run.parent.name:
        return f"stage {source.name}"
    return None


REQUIRED_RECORD_KEYS = ("step", "icl_curve", "best_context_loss")  # every evaluation record has held these


def read_metrics(path: Path) -> list[dict]:
    """The complete records of a metrics.jsonl; a cut or malformed line (a run still writing, a full disk) is
    skipped with a warning naming the file and the line."""
    records, last = [], None
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            log.warning(f"warning: {path}:{number}: incomplete line skipped (a run still writing?)")
            continue
        missing = [k for k in REQUIRED_RECORD_KEYS if not isinstance(record, dict) or k not in record]
        if missing:
            log.warning(f"warning: {path}:{number}: not an evaluation record (no {missing[0]!r}); skipped")
            continue
        check_record(record, f"{path}:{number}")
        if last is not None and not record["step"] > last[0]:  # the trainer drops the records past a resume's step
            raise RecordError(f"{path}:{number}: step {record['step']} after step {last[0]} (line {last[1]}): an "
                              f"evaluation repeated or out of order, which the trainer never writes (a file edited "
                              f"or joined from two runs?)")
        last = (record["step"], number)
        records.append(record)
    return records


class RecordError(ValueError):
    """A complete evaluation record holding a value of the wrong kind: the run's files are damaged, not still
    being written, so the report stops rather than leave the run out."""


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_record(record: dict, where: str) -> None:
    """RecordError naming `where` and the field when a record's step, best-context loss or ICL curve is not
    numbers (NaN, which a diverged run writes, is a number: the table shows it as nan)."""
    if not _is_number(record["step"]):
        raise RecordError(f"{where}: step is {json.dumps(record['step'])}, not a number")
    for key in ("best_context_loss", "last10_loss", "flops", "tokens", "best_context_gap", "max_bin_gap"):
        if key in record and record[key] is not None and not _is_number(record[key]):
            raise RecordError(f"{where}: {key} is {json.dumps(record[key])}, not a number")
    if not _is_number(record["best_context_loss"]):
        raise RecordError(f"{where}: best_context_loss is {json.dumps(record['best_context_loss'])}, not a number")
    for key in ("icl_curve", "bayes_curve"):
        curve = record.get(key)
        if key in record and not (isinstance(curve, list) and curve and all(
                isinstance(b, list) and len(b) == 3 and all(_is_number(x) for x in b) for b in curve)):
            raise RecordError(f"{where}: {key} is not a list of [start, end, loss] bins")
    best, losses = record["best_context_loss"], [b[2] for b in record["icl_curve"]]
    if not (best in losses or (math.isnan(best) and any(math.isnan(v) for v in losses))):
        raise RecordError(f"{where}: best_context_loss {best} is none of its icl_curve's bins' losses (the trainer "
                          f"takes it from one): the record was edited")


def load_run(path: Path) -> Run:
    """A run folder: config.yaml + metrics.jsonl (its records may be none yet: see `Run.status`)."""
    path = Path(path)
    if not (path / "config.yaml").exists():
        raise FileNotFoundError(f"{path}: no config.yaml beside metrics.jsonl")
    try:
        config = OmegaConf.to_container(OmegaConf.load(path / "config.yaml"))
    except Exception as err:  # OmegaConf/YAML raise many types; the run is left out, the line says why
        raise ValueError(f"{path / 'config.yaml'}: unreadable ({type(err).__name__}: {str(err).splitlines()[0]})")
    if not isinstance(config, dict) or not isinstance(config.get("attention"), dict) or "ctx" not in config:
        raise ValueError(f"{path / 'config.yaml'}: not a run config (no attention group or ctx)")
    run = Run(path=path, config=config, records=read_metrics(path / "metrics.jsonl"))
    run.flat = flat_config(config)
    changed = resume_changes(path, run.flat)
    if changed:  # what it trained under is more than config.yaml says: labelled, and never a seed of one that was not
        run.flat[RESUMED] = changed
    run.provenance = provenance_record(path)
    check_config_against_launch(path, run.flat, run.provenance)
    run.last_launch = newest_resume_config(path, run.provenance)
    own = own_stage_source(path, run.flat.get("trainer.init_from"))
    if own:
        run.flat["trainer.init_from"] = own
    entries, run.eval_items = data_items(path, config, run.flat, run.ctx)
    run.flat.update(entries)
    run.group_key = tuple(sorted((k, _hashable(v)) for k, v in run.flat.items() if k != "seed"))
    run.status = run_status(run)
    return run


_RESUME_CONFIG = re.compile(r"^config\.resume_step(\d+)(?:\.launch(\d+))?\.yaml$")


def _resume_configs(path: Path) -> list[Path]:
    """A run's config.resume_step{N}[.launch{k}].yaml files: the trainer writes one per launch, and touches it again
    when a launch repeats a config on file."""
    return [p for p in path.glob("config.resume_step*.yaml") if _RESUME_CONFIG.match(p.name)]


def _written(p: Path) -> tuple:
    """Order of the launches' configs: by the step each resumed from (config.yaml's launch: step 0), then, among the
    launches from one step, the latest written (a launch repeating a config on file touches it). File times order
    only the launches from one step: a copy that does not keep them (cp -r, scp, git) cannot reorder the steps."""
    match = _RESUME_CONFIG.match(p.name)
    return int(match.group(1)) if match else 0, p.stat().st_mtime_ns, p.name


def _recorded_newest(path: Path, record: dict | None) -> Path | None:
    """The config file of the run's newest launch as its provenance record names it (launches record the config they
    trained under), None for runs made before they did or without a record."""
    launches = (record or {}).get("launches") or [record or {}]
    name = launches[-1].get("config_file") if isinstance(launches, list) and isinstance(launches[-1], dict) else None
    if not isinstance(name, str) or Path(name).name != name or not (path / name).is_file():
        return None
    return path / name


def _flat_config_file(p: Path) -> dict | None:
    """A config file flattened as the run's own (flat_config), None when it cannot be read."""
    try:
        return flat_config(OmegaConf.to_container(OmegaConf.load(p)))
    except Exception:
        return None


def newest_resume_config(path: Path, record: dict | None = None) -> dict:
    """The flattened config of a run's newest launch when it resumed, {} when it never resumed, its first config is
    the newest, or the file is unreadable (the run's status then falls back to config.yaml's bounds). record: the
    run's provenance record (provenance_record), which names the newest launch's config where the run is recent."""
    newest = _recorded_newest(path, record) or max(_resume_configs(path) + [path / "config.yaml"], key=_written)
    return {} if newest.name == "config.yaml" else _flat_config_file(newest) or {}


RESUMED = "resumed"  # the flattened config's entry for what a run's resumes changed (runs without any lack it)
# keys a resume may change without changing what trains or what an evaluation measures
NOT_TRAINING = {"trainer.eval_every", "trainer.compile", "trainer.activation_checkpointing", "trainer.micro_docs",
                "trainer.context_parallel", "trainer.init_from", "attention.chunk_size"}


def resume_changes(path: Path, first: dict) -> str | None:
    """In words, every key a resume of the run changed from its launch before, by step (`at step 400: optim.lr 0.003
    -> 0.001`), over the newest launch from each step; None when no resume changed one. A resume may change the
    schedule, the optimizer's values, precision and the ICL bins (longctx.train.resume): config.yaml alone would file
    such a run with runs that never changed them."""
    newest: dict[int, Path] = {}
    for p in sorted(_resume_configs(path), key=_written):
        newest[int(_RESUME_CONFIG.match(p.name).group(1))] = p     # the latest written of each step stays
    changes, before = [], first
    for step in sorted(newest):
        now = _flat_config_file(newest[step])
        if now is None:  # an unreadable file: its launch is not compared
            continue
        moved = [f"{k} {show(k, before[k])} -> {show(k, now[k])}" for k in now
                 if k in before and k not in NOT_TRAINING and before[k] != now[k]]
        if moved:
            changes.append(f"at step {step}: {', '.join(moved)}")
        before = now
    return "; ".join(changes) or None


def run_status(run: Run) -> str:
    """'complete', 'no evaluation yet', or 'unfinished: step S of trainer.max_steps=M'. A run that stopped at its
    trainer.flops_budget or at the evaluation meeting its trainer.stop_when is complete. The bounds are those of
    its newest launch (a resume may have changed trainer.max_steps)."""
    if not run.records:
        return "no evaluation yet"
    bounds = run.last_launch or run.flat
    max_steps, budget = bounds.get("trainer.max_steps"), bounds.get("trainer.flops_budget")
    final = run.final
    if isinstance(budget, (int, float)) and final.get("flops", 0) >= budget:
        return "complete"
    try:
        stop_when = parse_stop_when(bounds.get("trainer.stop_when"))
    except ValueError:
        stop_when = None   # a bound this release does not know: judged by its steps
    if stop_when is not None and stop_when.met(final):
        return "complete"
    if isinstance(max_steps, int) and final["step"] < max_steps:
        return f"unfinished: step {final['step']} of trainer.max_steps={max_steps}"
    return "complete"


def load_runs(paths: list[Path]) -> tuple[list[Run], list[str]]:
    """Every run below `paths` that has an evaluation, and one line for each run left out (and why): one run
    still starting never blocks the others."""
    runs = []
    found = find_runs(paths)
    left_out = [f"{run}: no evaluation yet (no metrics.jsonl: it stopped, or is running, before its first "
                f"trainer.eval_every)" for run in unevaluated_runs(paths)]
    for path in found:
        try:
            run = load_run(path)
        except RecordError:
            raise
        except (FileNotFoundError, ValueError) as err:
            left_out.append(str(err))
            continue
        if run.records:
            runs.append(run)
        else:
            left_out.append(f"{path}: {run.status}")
    for line in left_out:
        log.warning(f"warning: left out: {line}")
    if not runs:
        raise ValueError("no run below " + ", ".join(str(p) for p in paths) + " has an evaluation yet")
    return runs, left_out


# ----- configs: flattened, defaults filled in ---------------------------------------------------------------

def flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def group_defaults(config: dict) -> dict:
    """The flattened defaults of the config groups the run used (conf/<group>/<name>.yaml, interpolations left out):
    a config written before a key existed ran with that key's default."""
    out = {}
    for group in CONF_GROUPS:
        chosen = config.get(group)
        if not isinstance(chosen, dict):
            continue
        for name in dict.fromkeys(str(chosen.get(k)) for k in ("tag", "name") if chosen.get(k) is not None):
            path = CONF_DIR / group / f"{name}.yaml"
            if path.exists():
                tree = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
                out.update({f"{group}.{k}": v for k, v in flatten(tree).items()
                            if not (isinstance(v, str) and "${" in v)})
                break
    return out


def attention_params(attention_cfg: dict) -> dict:
    """A run's attention parameters with the core's defaults filled in; an attention no longer registered keeps
    what its config says."""
    given = {k: v for k, v in attention_cfg.items() if k not in CONF_ONLY_KEYS}
    try:
        defaults = {f.name: f.default for f in dataclasses.fields(attention_class(attention_cfg["name"]).Params)}
    except (ValueError, KeyError):
        return given
    return {**defaults, **given}


def flat_config(config: dict) -> dict:
    flat = {**group_defaults(config), **flatten(config)}
    if isinstance(config.get("attention"), dict):
        flat.update({f"attention.{k}": v for k, v in attention_params(config["attention"]).items()})
    return {k: v for k, v in flat.items() if k not in IGNORED_KEYS and not k.startswith(IGNORED_PREFIXES)}


def show(key: str, value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if key == "trainer.init_from":
        return Path(str(value)).name
    return str(value)


# ----- names, labels, groups --------------------------------------------------------------------------------

def short_names(paths: list[Path], taken: frozenset = frozenset()) -> list[str]:
    """Each path's shortest trailing part that no other path shares and that is not `taken`."""
    def suffix(path: Path, depth: int) -> str:
        return "/".join(path.parts[-depth:])

    names = []
    for i, path in enumerate(paths):
        others = [p for j, p in enumerate(paths) if j != i]
        depth = 1
        while depth < len(path.parts) and (suffix(path, depth) in taken
                                           or any(suffix(path, depth) == suffix(p, depth) for p in others)):
            depth += 1
        names.append(suffix(path, depth))
    return names


def name_runs(runs: list[Run], taken: frozenset = frozenset()) -> None:
    """Each run's name: the shortest trailing part of its path that no other run shares and that is not `taken` (the
    names of runs carried from earlier records: another folder's run of the same name is another run)."""
    for run, name in zip(runs, short_names([run.path for run in runs], taken)):
        run.name = name


def _identity_key(group: str, flat: dict) -> str:
    """The key naming a run's choice in a config group: its tag when it has one (the data's variant), else name."""
    return f"{group}.tag" if f"{group}.tag" in flat else f"{group}.name"


def _partition(key: str, run: Run) -> str:
    """Which runs a key is compared among: a group's own keys among runs that chose the same member of the group
    (model.n_layer between two `model=small` runs, not between small and large, whose names already differ)."""
    group = key.split(".", 1)[0]
    if "." not in key or group not in CONF_GROUPS:
        return ""
    identity = _identity_key(group, run.flat)
    return "" if key == identity else str(run.flat.get(identity))


def differing_keys(runs: list[Run]) -> list[str]:
    """Config keys whose value differs between runs, in the configs' order (see `_partition`)."""
    keys = list(dict.fromkeys(k for r in runs for k in r.flat))
    out = []
    for key in keys:
        group = key.split(".", 1)[0]
        if group in CONF_GROUPS and key.endswith((".name", ".tag")) and key != _identity_key(group, runs[0].flat):
            continue  # a group is named once (data.tag, not also data.name)
        if key in ("attention.name", "attention.tag"):
            continue  # the label starts with the attention's tag
        values: dict[str, set] = {}
        for r in runs:
            values.setdefault(_partition(key, r), set()).add(_compared(key, r.flat.get(key, UNSET)))
        if any(len(v) > 1 for v in values.values()):
            out.append(key)
    return out


def _compared(key: str, value) -> str:
    """A value as runs are told apart by it: an init_from source by its whole path (two runs' checkpoints share
    their file names), every other value as shown."""
    return str(value) if key == "trainer.init_from" else show(key, value)


def source_names(runs: list[Run]) -> dict[str, str]:
    """{trainer.init_from: the shortest tail of its path that no other run's source shares}."""
    sources = {str(r.flat.get("trainer.init_from")) for r in runs if r.flat.get("trainer.init_from")}
    names = {}
    for source in sources:
        parts = Path(source).parts
        depth = 1
        while depth < len(parts) and any(Path(o).parts[-depth:] == parts[-depth:] for o in sources if o != source):
            depth += 1
        names[source] = "/".join(parts[-depth:])
    return names


def _label_part(run: Run, key: str, sources: dict[str, str] | None = None) -> str:
    group, _, rest = key.partition(".")
    value = show(key, run.flat.get(key, "none" if key == RESUMED else UNSET))
    if key == "trainer.init_from" and sources:
        value = sources.get(str(run.flat.get(key)), value)
    if group in CONF_GROUPS and key == _identity_key(group, run.flat):
        return f"{group}={value}"          # as the override is typed: data=icl_markov_long
    return f"{rest}={value}" if group == "attention" else f"{key}={value}"


def _labels(runs: list[Run], keys: list[str], sources: dict[str, str]) -> list[tuple[str, str]]:
    """(label, label without the seed) of each run: its attention's tag, then each of `keys` that differs among the
    runs compared with it (`_partition`)."""
    out = []
    for run in runs:
        parts = [_label_part(run, k, sources) for k in keys
                 if len({_compared(k, r.flat.get(k, UNSET)) for r in runs
                         if _partition(k, r) == _partition(k, run)}) > 1]
        unseeded = [p for p in parts if not p.startswith("seed=")]
        out.append((", ".join([run.tag] + parts), ", ".join([run.tag] + unseeded)))
    return out


def label_runs(runs: list[Run], taken: frozenset = frozenset()) -> list[str]:
    """Label each run by its attention plus every config key that differs between the runs; return those keys.
    A cadence key (CADENCE_KEYS: how often a run evaluated and checkpointed) labels the runs only where it is all
    that tells two of them apart (their labels without the seed would be one otherwise).
    taken: names the runs must not take (name_runs)."""
    name_runs(runs, taken)
    keys = differing_keys(runs)
    sources = source_names(runs)
    labels = _labels(runs, keys, sources)
    shown = [k for k in keys if k not in CADENCE_KEYS]
    if shown != keys:
        without = _labels(runs, shown, sources)
        told_apart = all(without[i][1] != without[j][1] for i in range(len(runs)) for j in range(i + 1, len(runs))
                         if labels[i][1] != labels[j][1])
        if told_apart:
            keys, labels = shown, without
    for run, (label, seed_label) in zip(runs, labels):
        run.label, run.seed_label = label, seed_label
    return keys


@dataclass
class Group:
    """Runs that differ only in their seed (one run: a group of one)."""
    runs: list[Run]
    label: str
    index: int   # its colour and line style

    @property
    def n_seeds(self) -> int:
        return len(self.runs)

    @property
    def first(self) -> Run:
        return self.runs[0]


def group_runs(runs: list[Run]) -> list[Group]:
    """Runs sharing their label without the seed and their whole config but the seed (init source and data
    included) form one group of seeds."""
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        groups.setdefault((run.seed_label, run.group_key), []).append(run)
    return [Group(runs=members, index=i,
                  label=label + (f" ({len(members)} seeds)" if len(members) > 1 else ""))
            for i, ((label, _), members) in enumerate(groups.items())]


def refuse_duplicate_seeds(groups: list[Group]) -> None:
    """ValueError naming both run folders when two runs of a group are not independent seeds: the same seed (one
    run twice, e.g. a copied folder), or the same evaluation records (a copy given another seed)."""
    for group in groups:
        for i, a in enumerate(group.runs):
            for b in group.runs[i + 1:]:
                if a.seed == b.seed and a.seed is not None:  # (a config without a seed: its records tell)
                    raise ValueError(f"{a.path} and {b.path}: the same config and seed={show('seed', a.seed)}, "
                                     f"not two seeds (a copied run?); report one of them")
                if same_records(a, b):
                    raise ValueError(f"{a.path} and {b.path}: identical evaluation records under seeds "
                                     f"{show('seed', a.seed)} and {show('seed', b.seed)} (a copied run?); report one "
                                     f"of them")


def same_records(a: Run, b: Run) -> bool:
    """Whether two runs' final evaluations are identical: the same curve, and the same per-document losses where
    both wrote them (independent trainings never agree to the last bit)."""
    fa, fb = a.final, b.final
    if fa["step"] != fb["step"] or fa["icl_curve"] != fb["icl_curve"]:
        return False
    da, db = a.doc_bins(fa), b.doc_bins(fb)
    return da is None or db is None or (da.loss.shape == db.loss.shape and np.array_equal(da.loss, db.loss,
                                                                                          equal_nan=True))


def data_difference(a: Run, b: Run) -> str:
    """What tells two runs' heldout data apart, as 'key: value vs value' parts."""
    ka, kb = dict(a.heldout_key[1:]), dict(b.heldout_key[1:])
    return "; ".join(f"{k}: {show(k, ka.get(k, UNSET))} vs {show(k, kb.get(k, UNSET))}"
                     for k in dict.fromkeys([*ka, *kb]) if ka.get(k, UNSET) != kb.get(k, UNSET))


def describe_comparison(runs: list[Run], keys: list[str]) -> str:
    """What the runs compare, for titles: the keys that differ, and what they share."""
    varied = ["attention" if k.startswith("attention.") else k for k in keys if k != "seed"]
    if len({r.tag for r in runs}) > 1:
        varied.insert(0, "attention")
    varied = list(dict.fromkeys(varied))
    shared = []
    for key in ("arch.name", "model.name", "data.tag", "ctx"):
        values = {show(key, r.flat.get(key, UNSET)) for r in runs}
        if len(values) == 1 and key not in keys:
            shared.append(("ctx " if key == "ctx" else "") + values.pop())
    seeds = "" if "seed" not in keys else " over seeds"
    if not varied:
        return f"{runs[0].tag} ({', '.join(shared)}){seeds}" if len(runs) > 1 else runs[0].label
    return f"{', '.join(varied)} compared ({', '.join(shared)}){seeds}"


# ----- provenance -------------------------------------------------------------------------------------------

PER_RUN_PROVENANCE = ("time", "command", "overrides", "launches", "git.diff_file")


def _override_value(text: str):
    """A command line's value as Hydra reads a plain one: an int, a float (1e-3 too), a bool, null, else the text."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    low = text.lower()
    return {"true": True, "false": False, "null": None}.get(low, text.strip("'\""))


# what a comparison is keyed on, checked against the first launch's command line (groups: their option is .name)
_LAUNCH_CHECKED_KEYS = ("seed", "ctx", "p", "window")
_LAUNCH_CHECKED_GROUPS = ("attention", "arch")
_LAUNCH_CHECKED_PREFIXES = ("attention.", "optim.", "model.")


def check_config_against_launch(path: Path, flat: dict, provenance: dict | None) -> None:
    """ValueError when config.yaml (the first launch's resolved config) disagrees with that launch's own command line
    on what runs are compared by (seed, ctx, the attention and its parameters, the architecture, the optimizer, the
    model): a config.yaml edited after training would move the run into another arm or seed unseen. Runs without a
    provenance record, keys the command line did not set, and a staged run's stages (each its own ctx, batch, lr or
    attention, under the one command line) are not checked."""
    if (path.parent / "stages.json").exists():
        return
    launches = (provenance or {}).get("launches", [provenance] if provenance else [])
    overrides = (launches[0] or {}).get("overrides") if launches else None
    for item in overrides or []:
        key, sep, given = str(item).lstrip("+~").partition("=")
        if not sep or "${" in given or given.startswith(("[", "{", "'", '"')) or "(" in given:
            continue   # interpolations, lists, dicts, quoted strings, sweep functions: not compared
        if key in _LAUNCH_CHECKED_GROUPS:
            key, want = f"{key}.name", given
        elif key in _LAUNCH_CHECKED_KEYS or key.startswith(_LAUNCH_CHECKED_PREFIXES):
            want = _override_value(given)
        else:
            continue
        have = flat.get(key, UNSET)
        same = have == want or (_is_number(have) and _is_number(want) and math.isclose(have, want, rel_tol=1e-9))
        if have is not UNSET and not same:
            raise ValueError(f"{path / 'config.yaml'}: {key}={show(key, have)}, but the run was launched with {item} "
                             f"(provenance.json): the config was edited after training; restore it")


def provenance_record(path: Path) -> dict | None:
    """<run_dir>/provenance.json as written, when the run has one (older runs do not); one that is not a JSON object
    is ignored, with a warning when it is not JSON at all."""
    path = Path(path) / "provenance.json"
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        log.warning(f"warning: {path}: not valid JSON ({err.msg}, line {err.lineno}); ignored")
        return None
    except (OSError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


CODE_KEY = "code of every launch"  # provenance_differences' entry: each launch's commit and uncommitted diff


def launches_code(run: Run) -> str | None:
    """The code each launch of a run trained with, in launch order, repeats dropped: its commit, '+diff <digest>' when
    the tree was dirty (provenance.diff_digest of the diff file beside the record: two runs of one commit with other
    uncommitted edits differ here), joined by ' -> '. None for a run without a record."""
    from longctx.provenance import diff_digest

    if run.provenance is None:
        return None
    launches = run.provenance.get("launches") or [run.provenance]
    codes = []
    for launch in launches if isinstance(launches, list) else []:
        git = launch.get("git") if isinstance(launch, dict) else None
        git = git if isinstance(git, dict) else {}
        code = str(git.get("commit"))[:12]
        if git.get("dirty"):
            diff = run.path / str(git.get("diff_file") or "")
            code += f"+diff {diff_digest(diff.read_bytes()) if git.get('diff_file') and diff.is_file() else 'unknown'}"
        if not codes or codes[-1] != code:
            codes.append(code)
    return " -> ".join(codes)


def provenance_differences(runs: list[Run]) -> dict[str, dict[str, str]]:
    """{field: {run name: value}} for the provenance fields that differ between runs; runs without a
    provenance.json show as '(none)'. Fields that differ by design between the runs of one sweep (time, command,
    overrides, each launch's record, the diff file's name) are left out: the run table shows what differs in the
    config, this lists code, versions and machines. CODE_KEY compares the code of every launch (a resume under
    another commit, or uncommitted edits that differ): listed when it differs between runs or within one."""
    prov = {run.name: None if run.provenance is None else flatten(run.provenance) for run in runs}
    if all(p is None for p in prov.values()):
        return {}
    keys = list(dict.fromkeys(k for p in prov.values() if p for k in p if k not in PER_RUN_PROVENANCE))
    out = {}
    for key in keys:
        values = {name: ("(none)" if p is None else json.dumps(p.get(key)) if not isinstance(p.get(key), str)
                         else p[key]) for name, p in prov.items()}
        if len(set(values.values())) > 1:
            out[key] = values
    code = {run.name: launches_code(run) or "(none)" for run in runs}
    if len(set(code.values())) > 1 or any(" -> " in c for c in code.values()):
        out[CODE_KEY] = code
    return out


def config_digest(run: Run) -> str:
    """A short digest of the run's whole config but its seed (group_key): equal for the seeds of one config, and
    kept in a record so that runs joined under one label across reports can be told apart (record.check_seed_labels)."""
    import hashlib

    return hashlib.sha1(repr(run.group_key).encode()).hexdigest()[:12]


def check_record_labels(record: dict, where: str) -> None:
    """check_seed_labels of a record's own runs (a record edited, or written before the report refused such labels):
    ValueError naming the record."""
    try:
        check_seed_labels([{"record": record}], [])
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None


def check_seed_labels(carried: list[dict], runs: list[Run]) -> None:
    """ValueError when one label (without its seed) would hold two runs of one seed, or runs of two configs (their
    digests, where the records hold them), across the carried records and the runs reported: a record's readers
    (plot_results, the findings) take a label's runs as the seeds of one config."""
    members: dict[str, list[tuple]] = {}
    for c in carried:
        for entry in c["record"]["runs"]:
            members.setdefault(entry.get("seed_label", entry["label"]), []).append(
                (entry["name"], entry.get("seed"), entry.get("config")))
    for run in runs:
        members.setdefault(run.seed_label, []).append((run.name, run.seed, config_digest(run)))
    for label, held in members.items():
        seeds: dict = {}
        for name, seed, _ in held:
            if seed is not None and seed in seeds:
                raise ValueError(f"label {label!r}: runs {seeds[seed]} and {name} are both seed {seed}; a label's runs "
                                 f"are the seeds of one config (rename one side with --label)")
            seeds[seed] = name
        configs: dict = {}
        for name, _, config in held:
            if config is not None:
                configs.setdefault(config, name)
        if len(configs) > 1:
            a, b = list(configs.values())[:2]
            raise ValueError(f"label {label!r}: runs {a} and {b} differ in their config beyond the seed; a label's "
                             f"runs are the seeds of one config (rename one side with --label)")


def _hashable(value):
    """A config value as a dict key part: lists (e.g. data.state_counts) become tuples."""
    return tuple(_hashable(v) for v in value) if isinstance(value, (list, tuple)) else value


def runs_from_record(record: dict, folder: Path, source: str = "the report record") -> list[Run]:
    """Run objects the figure functions draw, from a compact record (per-document files relative to `folder`;
    `source`, the record's file name, is what a warning about a missing one names)."""
    runs = []
    for entry in record["runs"]:
        run = Run(path=Path(folder), config={"attention": {"name": entry["attention"], "tag": entry["attention"]},
                                             "ctx": entry["ctx"]},
                  records=entry["records"], flat={"data.heldout": re.sub(r", ctx=\d+$", "", entry["heldout"]),
                                                 "seed": entry.get("seed")},
                  name=entry["name"], label=entry["label"], seed_label=entry.get("seed_label", entry["label"]),
                  status=entry.get("status", "complete"), source=source, code=entry.get("code"))
        runs.append(run)
    return runs
