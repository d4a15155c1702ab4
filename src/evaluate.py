"""Evaluate a trained run: heldout loss at any context and on any data, or retrieval (passkey, needle in a haystack).

    python -m longctx.evaluate RUN_DIR --ctx 2048
    python -m longctx.evaluate RUN_DIR --ctx 65536 data=longcrawl64 data.path=/data/lc64 --docs 16 --out lc64.json
    python -m longctx.evaluate RUN_DIR --task passkey --contexts 1024,4096 --depths 0,0.5,1 --trials 20
    python -m longctx.evaluate RUN_DIR --task needle
    python -m longctx.evaluate RUN_DIR --harness --tasks heldout,passkey     # lm-eval-harness (longctx.hf.harness)

The heldout task (default) writes FILE.json (the per-position heldout loss, the binned ICL curve, best-context loss,
last-10% loss, and the Bayes-optimal curve where the data has one), FILE.npz (each document's binned loss, the
trainer's per-document record) and FILE.png (the ICL curve). A retrieval task writes FILE.json (accuracy by context
and depth) and FILE.png (its heatmap), and logs both to the run's wandb run when the run logs to wandb. FILE
defaults to a new file in RUN_DIR/eval/; nothing is ever overwritten. Data overrides are the trainer's: `data=NAME`
(conf/data/NAME.yaml), `data.KEY=VALUE`; without them the run's own data is used. Every argument is checked before
any work, a context's memory estimate included: bad input gives one line `error: ...` and exit code 2, and nothing is
written. A failed write (a full disk) is one line and exit code 1; the records are written whole or not at all, and
a figure that cannot be written leaves them whole. Progress goes to stderr (train/console.py's command_progress),
after a one-line estimate of the forwards' time (longctx.train.estimate; a long one names a shorter --ctx).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from longctx import provenance
from longctx.data import dataset_info, heldout_batch
from longctx.data.longcrawl64 import joined_documents
from longctx.eval import (TASKS, HeldoutEvaluation, alphabet_for, doc_record, eval_line, retrieval_line,
                          run_retrieval, write_doc_record)
from longctx.eval.loss import model_device, uses_bf16
from longctx.eval.plots import plot_icl, plot_retrieval
from longctx.eval.retrieval import prompt_length
from longctx.generate import recorded_tokens, run_codec
from longctx.runs import check_data_tokens, check_device, check_own_heldout, load_run
from longctx.train.config import check_set, check_types, did_you_mean, schema
from longctx.train.console import command_progress, setup_logging
from longctx.train.data import build_heldout, resolve_splits
from longctx.train.estimate import (assumed_rate, check_evaluation_fits, data_vocab, evaluation_line, evaluation_seconds,
                                   forward_memory)

# evaluate's way out where a run's heldout data holds another tokenizer's ids (runs.check_data_tokens)
OWN_DATA = "evaluate it on data of its own tokenizer"

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError)
DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


# ----- arguments ------------------------------------------------------------------------------------------
def positive_int(flag: str, value, allow_none: bool = True, least: int = 1) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{flag}={value!r}: must be an integer >= {least}")


def int_list(flag: str, text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag}={text!r}: expected comma-separated integers, e.g. 1024,4096") from None
    if not values or any(v < 2 for v in values):
        raise ValueError(f"{flag}={text!r}: expected one or more integers >= 2")
    return sorted(set(values))


def depth_list(text: str | None) -> list[float] | None:
    if text is None:
        return None
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--depths={text!r}: expected comma-separated fractions, e.g. 0,0.5,1") from None
    if not values or any(not 0 <= v <= 1 for v in values):
        raise ValueError(f"--depths={text!r}: expected one or more fractions in [0, 1] (0 = start of the context)")
    return sorted(set(values))


def outputs_of(path: Path, task: str) -> list[Path]:
    """Every file an evaluation writes for the JSON `path`."""
    if task == "harness":  # the results, and the folder of the export and the tasks lm-eval read
        return [path, path.with_suffix("")]
    return [path, path.with_suffix(".png")] + ([path.with_suffix(".npz")] if task == "heldout" else [])


def check_writable(path: Path, flag: str) -> None:
    """The folder of `path` exists and takes a new file, or can be created (probed, nothing left behind)."""
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise ValueError(f"{flag}={str(path)!r}: {folder} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise ValueError(f"{flag}={str(path)!r}: cannot write into {folder} ({err.strerror or err})") from None


def check_out(out: str, task: str) -> Path:
    """An explicit --out: a .json file that does not exist yet (nor the files beside it), in a writable place."""
    path = Path(out).expanduser()
    if path.is_dir():
        raise ValueError(f"--out={out!r}: is a folder; give a file name, e.g. {path / (task + '.json')}")
    if path.suffix != ".json":
        raise ValueError(f"--out={out!r}: must end in .json (the plot goes beside it, same name)")
    for p in outputs_of(path, task):
        if p.exists():
            raise ValueError(f"--out={out!r}: {p} exists and is never overwritten; choose another name (without "
                             f"--out a new file in the run's eval/ folder is picked)")
    check_writable(path, "--out")
    return path


def default_out(run_dir: Path, stem: str, task: str) -> Path:
    """RUN_DIR/eval/STEM.json, or STEM-2.json, STEM-3.json, ... : the first name none of whose files exists."""
    folder = run_dir / "eval"
    n = 1
    while True:
        path = folder / (f"{stem}.json" if n == 1 else f"{stem}-{n}.json")
        if not any(p.exists() for p in outputs_of(path, task)):
            break
        n += 1
    check_writable(path, "--out (default)")
    return path


# ----- data overrides -------------------------------------------------------------------------------------
def parse_data_overrides(overrides: list[str]) -> tuple[str | None, list[tuple[str, object]]]:
    """Hydra's override grammar -> (the data=NAME option or None, [(KEY, value) of each data.KEY=VALUE])."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    option, keys = None, []
    for item in overrides:
        try:
            parsed = parser.parse_overrides([item])[0]
        except Exception:  # Hydra's parse errors span several lines
            raise ValueError(f"{item!r}: not an override; expected data=NAME or data.KEY=VALUE") from None
        key = parsed.key_or_group
        if key == "data":
            if not isinstance(parsed.value(), str):
                raise ValueError(f"{item!r}: expected data=NAME, the name of a conf/data config")
            if option is not None:
                raise ValueError(f"{item!r}: data= given twice ({option!r} before)")
            if keys:
                raise ValueError(f"{item!r}: data=NAME must come before the data.KEY=VALUE overrides")
            option = parsed.value()
        elif key.startswith("data.") and len(key) > 5:
            keys.append((key[5:], parsed.value()))
        else:
            flag = "--" + key.replace("_", "-")
            hint = f" (the option {flag} {item.partition('=')[2]}?)" if flag in _parser()._option_string_actions else ""
            raise ValueError(f"{item!r}: expected a data override, data=NAME or data.KEY=VALUE{hint}")
    return option, keys


def compose_data(run_cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """The run's config with its data config replaced by conf/data/NAME.yaml (composed by Hydra, defaults chain and
    all) for `data=NAME`, then `data.KEY=VALUE` set -- mandatory `???` keys included -- and checked as train.py
    checks them (unknown keys, types, mandatory values)."""
    option, keys = parse_data_overrides(list(overrides))
    cfg = OmegaConf.create(OmegaConf.to_container(run_cfg, resolve=True))
    if option is not None:
        known = sorted(p.stem for p in (CONF_DIR / "data").glob("*.yaml"))
        if option not in known:
            raise ValueError(f"data={option}: no such data config; known: {', '.join(known)}"
                             f"{did_you_mean(option, known)}")
        from hydra import compose, initialize_config_dir

        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            composed = compose("config", overrides=[f"data={option}"])
        if run_cfg.get("cache_dir") is not None:
            composed.cache_dir = run_cfg.cache_dir  # generated datasets live where the run's did
        cfg.data = OmegaConf.to_container(composed.data, resolve=True)
    present = list(OmegaConf.to_container(cfg.data, resolve=False))  # `in` is False for a `???` value
    for key, value in keys:
        if key.split(".")[0] not in present:
            raise ValueError(f"data.{key}: not a key of the {cfg.data.name} data config (keys: {', '.join(present)})"
                             f"{did_you_mean(key.split('.')[0], present)}")
        OmegaConf.update(cfg, f"data.{key}", value, merge=False)
    source = CONF_DIR / "data" / f"{cfg.data.name}.yaml"
    if keys and "tag" not in dict(keys) and source.is_file():  # a tag drawn from the data's keys (mqar_n${.n_pairs})
        raw = OmegaConf.load(source)                             # follows the overrides
        if OmegaConf.is_interpolation(raw, "tag"):
            data = {**OmegaConf.to_container(cfg.data, resolve=False),
                    "tag": OmegaConf.to_container(raw, resolve=False)["tag"]}
            cfg.data.tag = str(OmegaConf.create({"data": data}).data.tag)
    data_only = OmegaConf.create({"data": OmegaConf.to_container(cfg.data, resolve=False)})
    check_set(data_only)
    check_types(data_only, schema(CONF_DIR, {"data": option} if option else None))
    positive_int("data.eval_docs", cfg.data.get("eval_docs"))
    # an experiment's `${...}` for it makes the type pass skip it; it sets the documents per forward (forward_docs)
    positive_int("data.docs_per_batch", cfg.data.get("docs_per_batch"))
    return cfg


def generated_vocab_fits(cfg: DictConfig, model) -> None:
    """A generated dataset's vocabulary (icl_markov, mqar) read from its config alone, before resolve_splits
    generates anything: `data=mqar` on a run of another vocabulary is refused at once, not after its generation."""
    if cfg.data.name not in ("icl_markov", "mqar"):  # a prepared dataset: data_vocab_fits reads its metadata
        return
    needed, vocab = data_vocab(cfg), model.spec.vocab_size
    if needed > vocab:
        what = "data.vocab + BOS" if cfg.data.name == "icl_markov" else "data.n_keys + data.n_values + filler + BOS"
        raise ValueError(f"data vocabulary {needed} (data={cfg.data.name}: {what}) does not fit the model's "
                         f"vocabulary {vocab}: the run was trained on other data; nothing was generated")


def data_vocab_fits(splits, model) -> None:
    vocab = model.spec.vocab_size
    if splits.info["vocab_size"] > vocab:
        raise ValueError(f"data vocabulary {splits.info['vocab_size']} ({splits.heldout_path}) does not fit the "
                         f"model's vocabulary {vocab}: the run was trained on other data")


def fits_memory(flag: str, contexts: list[int], model, cfg: DictConfig, micro_docs: int, precision: str,
                held_per_token: int, held_what: str, advice: str) -> None:
    """Refuse, before anything is built, a context at which the forward or the token arrays held on the host
    (`held_per_token` bytes per token of context) cannot fit: one line (longctx.train.estimate)."""
    device = model_device(model)
    bf16 = uses_bf16(device, precision)
    for ctx in sorted(contexts):
        forward = forward_memory(model, cfg, ctx, micro_docs, device.type, bf16)
        check_evaluation_fits(flag, ctx, forward, device, held_per_token * ctx, held_what, advice)


def say_time_estimate(model, contexts: list[int], docs: int, per_forward: int, precision: str, flag: str,
                      shorter: list[list[int]], otherwise: str, unit: str = "doc") -> None:
    """The forwards' time estimate, one line on stderr before the first (longctx.train.estimate.evaluation_line): one
    forward of long documents on a CPU can run for many minutes with nothing else said."""
    device = model_device(model)
    print(evaluation_line(model, contexts, docs, min(per_forward, docs), device, uses_bf16(device, precision), flag,
                          shorter, otherwise, unit), file=sys.stderr, flush=True)


def forward_docs(micro_docs: int | None, run_cfg: DictConfig, cfg: DictConfig) -> int:
    """Documents one forward holds: --micro-docs, else the run's trainer.micro_docs, else its data.docs_per_batch."""
    return int(micro_docs or run_cfg.trainer.micro_docs or cfg.data.docs_per_batch)


FORWARD_PACE_S = 60   # the longest one forward of a heldout evaluation is estimated to take, unless --micro-docs


def paced_forward_docs(model, ctx: int, docs: int, precision: str, per_forward: int, source: str) -> tuple[int, str]:
    """(documents a forward holds, where that number came from): `per_forward`, fewer where one forward of `docs`
    documents at `ctx` is estimated (longctx.train.estimate) to take over FORWARD_PACE_S, so that the progress moves
    during a long evaluation (one forward of 16 documents at 64k on a CPU ran silent for 8 minutes). Each document's
    loss is its own whatever the split."""
    device = model_device(model)
    rate = assumed_rate(device)
    if rate is None or docs <= 1:
        return per_forward, source
    seconds = evaluation_seconds(model, [ctx], docs, docs, device, uses_bf16(device, precision), rate)[1]
    if seconds <= FORWARD_PACE_S:
        return per_forward, source
    paced = max(1, int(docs * FORWARD_PACE_S / seconds))
    return paced, f"a forward of {docs} estimated at ~{seconds / 60:.0f} min (the run's number); --micro-docs sets it"


def forward_docs_source(micro_docs: int | None, run_cfg: DictConfig) -> str:
    """Where forward_docs' number came from, as the progress line says it."""
    if micro_docs:
        return "--micro-docs"
    key = "trainer.micro_docs" if run_cfg.trainer.micro_docs else "data.docs_per_batch"
    return f"the run's {key}; --micro-docs sets it"


def run_facts(run_dir, model, run_cfg, cfg, splits, data_overrides=(), precision: str = "auto",
              micro_docs: int | None = None) -> dict:
    """What was evaluated and how: the checkpoint, the data (with the data.KEY= overrides given), the device, the
    precision as resolved (auto: bf16 on CUDA, fp32 else) and the documents a forward held."""
    device = model_device(model)
    return {"run_dir": str(run_dir), "checkpoint": str(model.checkpoint_path), "step": model.checkpoint_step,
            "train_ctx": int(run_cfg.ctx), "data": {"name": cfg.data.name, "heldout": str(splits.heldout_path)},
            "data_overrides": list(data_overrides), "arch": model.spec.arch, "attention": model.spec.attention,
            "attention_params": model.spec.attention_params, "device": str(device),
            "precision": "bf16" if uses_bf16(device, precision) else "fp32",
            "micro_docs": forward_docs(micro_docs, run_cfg, cfg), "code": provenance.code_now()}


def write_claimed(out: Path, write, again=None) -> Path:
    """write(out) -> out; with a default name (`again`: the next free one), a name another evaluation of the run took
    while this one worked moves on to the next free name (its JSON is created exclusively, first), so finished
    results are never lost to a concurrent one. A name the user gave stays an error."""
    while True:
        try:
            write(out)
            return out
        except FileExistsError:
            if again is None or again() == out:
                raise
            out = again()


def write_json(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "x") as f:  # never overwrites: a file that appeared since the checks is an error
        f.write(json.dumps(record, indent=1) + "\n")


class OutputError(OSError):
    """Writing an evaluation's files failed (a full disk): one line, exit 1."""


@contextlib.contextmanager
def records_whole(paths: list[Path]):
    """The records (JSON, NPZ) are written all or none: when a write fails, those this block made, partial ones and
    temporaries included, are removed (a file that was there before is never touched)."""
    made_here = [p for p in paths if not p.exists()]
    try:
        yield
    except FileExistsError:
        raise
    except OSError as err:
        for p in made_here:
            p.unlink(missing_ok=True)
            p.with_name(p.name + ".tmp").unlink(missing_ok=True)
        raise OutputError(f"{err.filename or paths[0]}: {err.strerror or err}; nothing was written") from None


@contextlib.contextmanager
def figure_or_error(png: Path, records: list[Path]):
    """The figure comes last: when it cannot be written, a partial one is removed and the records stay, whole."""
    made_here = not png.exists()
    try:
        yield
    except OSError as err:
        if made_here:
            png.unlink(missing_ok=True)
        raise OutputError(f"{png}: {err.strerror or err}; the figure was not written, the records were "
                          f"({', '.join(map(str, records))})") from None


# ----- the heldout task -----------------------------------------------------------------------------------
def evaluate(run_dir: str | Path, ctx: int | None = None, out: str | Path | None = None, data_overrides=(),
             docs: int | None = None, step: int | None = None, bins: int | None = None,
             micro_docs: int | None = None, device: str = "auto", precision: str = "auto") -> dict:
    """Evaluate the run's checkpoint on heldout documents at context `ctx` (default: the run's); writes the JSON
    (`out`, default a new file in RUN_DIR/eval/), the per-document record (.npz) and the plot (.png) beside it.
    Returns the record."""
    positive_int("--ctx", ctx, least=2)
    for flag, value in (("--docs", docs), ("--bins", bins), ("--micro-docs", micro_docs)):
        positive_int(flag, value)
    positive_int("--step", step, least=0)
    device = check_device(device)
    out = check_out(str(out), "heldout") if out is not None else None
    run_dir = Path(run_dir).expanduser()
    model, run_cfg = load_run(run_dir, step=step, device=device)
    cfg = compose_data(run_cfg, list(data_overrides))
    ctx = ctx or int(run_cfg.ctx)
    if docs is not None:
        cfg.data.eval_docs = docs
    generated_vocab_fits(cfg, model)
    def check_fits(held: int) -> None:   # `held` documents' inputs and targets, int64, beside the forward
        fits_memory("--ctx", [ctx], model, cfg, min(forward_docs(micro_docs, run_cfg, cfg), held), precision,
                    16 * held, f"{held} heldout documents held",
                    "evaluate at a shorter --ctx, or with fewer --docs or --micro-docs")

    # before any data is read or generated (generated documents are max(1024, ctx) long): the data config's count of
    # documents bounds what will be held; the count the heldout split has is checked again once it is known
    check_fits(int(cfg.data.eval_docs))
    splits = resolve_splits(cfg.data, ctx, "--ctx")  # refuses a --ctx longer than the documents
    data_vocab_fits(splits, model)
    check_data_tokens(run_dir, splits.heldout_path, recorded_tokens(run_dir), OWN_DATA)
    if not data_overrides:
        check_own_heldout(run_dir, splits.heldout_path)
    check_fits(min(cfg.data.eval_docs, dataset_info(splits.heldout_path)["num_docs"]))
    evaluation = HeldoutEvaluation(build_heldout(splits, cfg.data, ctx, model.spec.vocab_size,
                                                 "--docs" if docs is not None else "data.eval_docs"),
                                   bins or int(run_cfg.trainer.icl_bins), bins_key="--bins")
    stem = f"ctx{ctx}-step{model.checkpoint_step}-{cfg.data.get('tag', cfg.data.name)}"
    again = None if out else (lambda: default_out(run_dir, stem, "heldout"))
    out = out or again()
    per_forward, source = forward_docs(micro_docs, run_cfg, cfg), forward_docs_source(micro_docs, run_cfg)
    if micro_docs is None:   # the run's number, unless one forward of it would leave the progress still for minutes
        per_forward, source = paced_forward_docs(model, ctx, min(evaluation.docs_per_forward(per_forward),
                                                                 evaluation.n_docs), precision, per_forward, source)
    powers_below = [[2 ** k] for k in range((ctx - 1).bit_length() - 1, 0, -1)]
    say_time_estimate(model, [ctx], evaluation.n_docs, evaluation.docs_per_forward(per_forward), precision, "--ctx",
                      powers_below, "fewer --docs")
    start = time.perf_counter()
    with command_progress(evaluation.n_docs, f"evaluate ctx {ctx}", "doc",
                          evaluation.forwards_note(per_forward, source)) as progress:
        result = evaluation.run(model, per_forward, precision, on_batch=progress.update)
    if not result.finite:
        raise FloatingPointError(f"non-finite heldout loss ({int((~np.isfinite(result.per_position)).sum())} of "
                                 f"{ctx} positions) from {model.checkpoint_path}: its weights are not usable; "
                                 f"nothing written")
    record = {**run_facts(run_dir, model, run_cfg, cfg, splits, data_overrides, precision, per_forward),
              "task": "heldout", "ctx": ctx,
              "docs": evaluation.n_docs, "seconds": round(time.perf_counter() - start, 2)}
    record.update(result.summary)
    record["per_position_loss"] = [round(float(x), 5) for x in result.per_position]

    def write(path: Path) -> None:
        record["doc_bins"] = path.with_suffix(".npz").name  # beside the JSON
        with records_whole([path, path.with_suffix(".npz")]):
            write_json(path, record)  # first: created only if absent
            write_doc_record(path.with_suffix(".npz"), doc_record(evaluation, result))
    out = write_claimed(out, write, again)
    title = (f"{run_dir.name}: step {record['step']} evaluated at ctx {ctx} (trained at {record['train_ctx']}), "
             f"{cfg.data.name}, {record['docs']} heldout documents")
    with figure_or_error(out.with_suffix(".png"), [out, out.with_suffix(".npz")]):
        plot_icl([record], out.with_suffix(".png"), title, record["train_ctx"])
    return record | {"out": str(out)}


# ----- retrieval tasks ------------------------------------------------------------------------------------
def evaluate_retrieval(run_dir: str | Path, task: str, contexts: list[int] | None = None,
                       depths: list[float] | None = None, trials: int = 20, digits: int = 5,
                       out: str | Path | None = None, data_overrides=(), step: int | None = None,
                       micro_docs: int | None = None, device: str = "auto", precision: str = "auto", seed: int = 0,
                       wandb: bool = True) -> dict:
    """Passkey or needle-in-a-haystack accuracy (longctx.eval.retrieval) of the run's checkpoint at each of
    `contexts` (default: a quarter, half and all of the run's ctx) and `depths` (default 0, 0.25, 0.5, 0.75, 1)
    over `trials` prompts each; writes the JSON and the heatmap beside it. Returns the record."""
    if task not in TASKS:
        raise ValueError(f"--task={task!r}: expected heldout, {', '.join(TASKS)}")
    for flag, value in (("--trials", trials), ("--digits", digits), ("--micro-docs", micro_docs)):
        positive_int(flag, value)
    positive_int("--step", step, least=0)
    positive_int("--seed", seed, least=0)
    device = check_device(device)
    out = check_out(str(out), task) if out is not None else None
    run_dir = Path(run_dir).expanduser()
    model, run_cfg = load_run(run_dir, step=step, device=device)
    cfg = compose_data(run_cfg, list(data_overrides))
    train_ctx = int(run_cfg.ctx)
    wanted = contexts or [train_ctx // 4, train_ctx // 2, train_ctx]
    longest = max(wanted)
    generated_vocab_fits(cfg, model)
    prompts = len(depths or DEFAULT_DEPTHS) * trials  # of one context, int64, held twice (+ BOS) with the haystacks

    def check_fits(contexts: list[int], needle_docs: int) -> None:
        fits_memory("--contexts", contexts, model, cfg, min(forward_docs(micro_docs, run_cfg, cfg), prompts),
                    precision, 8 * (2 * prompts + trials + needle_docs), f"{prompts} prompts of a context held",
                    "evaluate shorter --contexts, or with fewer --trials, --depths or --micro-docs")

    needle_docs = 2 * trials + 16 if task == "needle" else 0   # at most; the split's own count is checked below
    check_fits(wanted, needle_docs)   # before any data is read or generated
    splits = resolve_splits(cfg.data, longest if task == "needle" else min(train_ctx, longest))
    data_vocab_fits(splits, model)
    check_data_tokens(run_dir, splits.heldout_path, recorded_tokens(run_dir), OWN_DATA)
    if not data_overrides and task == "needle":   # the haystacks are the run's heldout documents
        check_own_heldout(run_dir, splits.heldout_path)
    text = text_codec_of(cfg, None if data_overrides else run_dir)
    alphabet = alphabet_for(splits.info["vocab_size"], splits.info["bos_id"], longest,
                            None if text is None else text[0], seed)
    shortest = prompt_length(alphabet, digits) + 1
    if contexts is None:
        contexts = [c for c in wanted if c >= shortest] or [train_ctx]
    too_short = [c for c in contexts if c < shortest]
    if too_short:
        raise ValueError(f"--contexts: {too_short[0]} is shorter than a prompt's two copies of marker "
                         f"({len(alphabet.marker)} tokens) + key ({digits}) + 1 token of haystack; use contexts "
                         f">= {shortest}")
    check_fits(contexts, min(dataset_info(splits.heldout_path)["num_docs"], needle_docs))
    documents = None
    if task == "needle":
        available = dataset_info(splits.heldout_path)["num_docs"]
        if dataset_info(splits.heldout_path)["packed"]:  # rows of several documents: haystacks of their text alone
            documents = joined_documents(str(splits.heldout_path), max(contexts), min(available, 2 * trials + 16))
        else:
            documents = heldout_batch(str(splits.heldout_path), max(contexts), min(available, 2 * trials + 16))
            documents = documents["targets"].numpy()
    again = None if out else (lambda: default_out(run_dir, f"{task}-step{model.checkpoint_step}", task))
    out = out or again()
    ordered = sorted(contexts)
    say_time_estimate(model, contexts, prompts, forward_docs(micro_docs, run_cfg, cfg), precision, "--contexts",
                      [ordered[:n] for n in range(len(ordered) - 1, 0, -1)],
                      "shorter --contexts, or fewer --trials or --depths", unit="prompt")
    start = time.perf_counter()
    with command_progress(len(contexts), task, "context") as progress:
        result = run_retrieval(model, task, alphabet, contexts, depths or list(DEFAULT_DEPTHS), trials, digits,
                               forward_docs(micro_docs, run_cfg, cfg), precision, documents, seed,
                               on_context=lambda _ctx: progress.update(1))
    record = {**run_facts(run_dir, model, run_cfg, cfg, splits, data_overrides, precision, micro_docs), **result,
              "seed": seed,
              "seconds": round(time.perf_counter() - start, 2)}
    if text is not None and tuple(text[0](str(i))[0] for i in range(alphabet.base)) == alphabet.digits:
        record.update(alphabet_text(alphabet, text[1]))  # a word alphabet: say the words

    def write(path: Path) -> None:
        with records_whole([path]):
            write_json(path, record)
    out = write_claimed(out, write, again)
    title = (f"{run_dir.name}: {task}, step {record['step']} (trained at ctx {record['train_ctx']}), "
             f"{trials} trials per cell, {digits}-symbol keys of base {alphabet.base}")
    with figure_or_error(out.with_suffix(".png"), [out]):
        png = plot_retrieval(record, out.with_suffix(".png"), title)
    if wandb:
        record["wandb"] = log_to_run_wandb(run_dir, run_cfg, record, png)
    return record | {"out": str(out)}


def text_codec_of(cfg: DictConfig, run_dir: Path | None):
    """(encode, decode) of the tokenizer the evaluated data uses, or None (ids without text: the ICL Markov states,
    or a tokenizer this machine cannot load, said in a note). The run's own data: the tokenizer the run used
    (generate's `run_codec`: its kept copy, the dataset's, or the name it recorded); other data (`run_dir=None`,
    data overrides given): that dataset's own."""
    try:
        return run_codec(cfg, run_dir)
    except Exception as err:  # noqa: BLE001 - offline without tiktoken's cache, a tokenizer not on this machine
        cause = re.sub(r";? (or )?give --prompt-ids$", "", str(err).removeprefix("--prompt: "))  # generate's advice
        print(f"note: the data's tokenizer is unavailable ({type(err).__name__}: {cause}); the retrieval prompts "
              f"use an id alphabet (recorded in the JSON)", file=sys.stderr)
        return None


def alphabet_text(alphabet, decode) -> dict:
    """The prompt's marker and key symbols as the text the tokenizer reads them as (for the JSON record)."""
    return {"marker_text": decode(list(alphabet.marker)), "digits_text": [decode([d]) for d in alphabet.digits],
            "filler_text": decode(list(alphabet.filler))}


def log_to_run_wandb(run_dir: Path, run_cfg: DictConfig, record: dict, png: Path) -> str | None:
    """Add a retrieval evaluation to the run's own wandb run (its <run_dir>/wandb_id, its logger.wandb settings),
    against `retrieval/checkpoint_step`. Nothing happens for a run that never logged to wandb."""
    settings = run_cfg.get("logger", {}).get("wandb", {})
    id_file = run_dir / "wandb_id"
    if settings.get("mode", "disabled") == "disabled" or not id_file.exists():
        return None
    import wandb

    task = record["task"]
    run = wandb.init(project=settings.get("project"), entity=settings.get("entity"), group=settings.get("group"),
                     name=run_cfg.get("run_name"), dir=str(run_dir), mode=settings["mode"],
                     id=id_file.read_text().strip(), resume="allow", settings=wandb.Settings(silent=True))
    run.define_metric("retrieval/checkpoint_step")
    run.define_metric(f"retrieval/{task}/*", step_metric="retrieval/checkpoint_step")
    rows = [[c, d, record["key_accuracy"][i][j], record["digit_accuracy"][i][j], record["choice_accuracy"][i][j]]
            for i, c in enumerate(record["contexts"]) for j, d in enumerate(record["depths"])]
    run.log({"retrieval/checkpoint_step": record["step"],
             f"retrieval/{task}/key_accuracy": record["mean_key_accuracy"],
             f"retrieval/{task}/digit_accuracy": record["mean_digit_accuracy"],
             f"retrieval/{task}/choice_accuracy": record["mean_choice_accuracy"],
             f"retrieval/{task}/table": wandb.Table(columns=["context", "depth", "key_accuracy", "digit_accuracy",
                                                             "choice_accuracy"], data=rows),
             f"retrieval/{task}/heatmap": wandb.Image(str(png))})
    where = run.settings.sync_dir
    run.finish()
    return str(where)


# ----- lm-eval-harness ------------------------------------------------------------------------------------
def evaluate_harness(run_dir: str | Path, tasks: str | None = None, out: str | Path | None = None,
                     data_overrides=(), step: int | None = None, device: str = "auto", limit: int | None = None,
                     **options) -> dict:
    """Export the run, write its lm-eval tasks (longctx.hf.harness: `options` are its generate's) and run lm-eval on
    them; writes lm-eval's results as the JSON (`out`, default a new file in RUN_DIR/eval/) and keeps the export and
    the tasks in the folder of the same name beside it. Returns the record."""
    if data_overrides:
        raise ValueError(f"{data_overrides[0]}: --harness reads the run's own data (or --text FILE)")
    positive_int("--step", step, least=0)
    positive_int("--limit", limit)
    device = check_device(device)
    out = check_out(str(out), "harness") if out is not None else None
    run_dir = Path(run_dir).expanduser()
    config = run_dir / "config.yaml"
    if config.is_file() and OmegaConf.select(OmegaConf.load(config), "data.pack", default=False):
        raise ValueError(f"--harness: {run_dir} trained on packed documents (data.pack=true); the exported model's "
                         f"forward has no document boundaries, so its scores would mix documents: evaluate it "
                         f"without --harness")
    try:
        from longctx.hf.configuration import require
        require("lm_eval", what="longctx.evaluate --harness")
        from longctx.hf.harness import evaluate_run
    except ImportError as err:  # the hf extra is not installed: one line naming it
        raise ValueError(str(err)) from None
    from longctx.runs import pick_checkpoint

    step = pick_checkpoint(run_dir, step)[0]
    out = out or default_out(run_dir, f"harness-step{step}", "harness")
    start = time.perf_counter()
    record = {"run_dir": str(run_dir), "step": step,
              **evaluate_run(run_dir, out.with_suffix(""), tasks, step=step, device=device, limit=limit, **options),
              "seconds": round(time.perf_counter() - start, 2)}
    if limit is not None:  # lm-eval keeps each task's first rows: a smoke test, not the tasks' measures
        record["limit_note"] = (f"--limit {limit}: each task scored its first {limit} rows only (heldout: the bins "
                                f"of its first documents, a document's bins a row each; passkey/needle: the shortest "
                                f"context's first prompts), not the task's measure")
        logging.getLogger("longctx").warning(record["limit_note"])
    with records_whole([out]):
        write_json(out, record)
    return record | {"out": str(out)}


# ----- command line ---------------------------------------------------------------------------------------
def parse_args(argv):
    return _parser().parse_intermixed_args(argv)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m longctx.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="the run's directory (checkpoints/, config.yaml)")
    parser.add_argument("overrides", nargs="*", default=[], help="data overrides: data=NAME, data.KEY=VALUE "
                        "(optional)")
    parser.add_argument("--task", default="heldout", choices=("heldout", *TASKS),
                        help="heldout (loss, ICL curve; default), passkey, or needle (a key hidden in heldout text)")
    parser.add_argument("--out", help="the JSON to write (must not exist); the plot goes beside it "
                                      "(default: a new file in RUN_DIR/eval/)")
    parser.add_argument("--step", type=int, help="checkpoint step (default: the newest)")
    parser.add_argument("--micro-docs", type=int, help="documents (prompts) per forward (default: the run's)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"),
                        help="auto: bf16 autocast on CUDA, fp32 on CPU")
    held = parser.add_argument_group("heldout task")
    held.add_argument("--ctx", type=int, help="context length to evaluate at (default: the run's)")
    held.add_argument("--docs", type=int, help="heldout documents (default: the data config's eval_docs)")
    held.add_argument("--bins", type=int, help="ICL curve bins (default: the run's trainer.icl_bins)")
    ret = parser.add_argument_group("retrieval tasks (passkey, needle)")
    ret.add_argument("--contexts", help="prompt lengths, comma-separated (default: 1/4, 1/2 and all of the run's ctx)")
    ret.add_argument("--depths", help="needle depths in [0, 1], comma-separated (default: 0,0.25,0.5,0.75,1)")
    ret.add_argument("--trials", type=int, help="prompts per context and depth (default 20)")
    ret.add_argument("--digits", type=int, help="symbols per key (default 5)")
    ret.add_argument("--seed", type=int, help="seed of the keys and of an id alphabet (default 0)")
    ret.add_argument("--no-wandb", action="store_true", help="do not add the result to the run's wandb run")
    harness = parser.add_argument_group("lm-eval-harness (--harness: needs pip install 'longctx[hf]')")
    harness.add_argument("--harness", action="store_true", help="export the run, write its lm-eval tasks and run "
                         "lm-eval on them (docs/evaluate.md (Hugging Face)); takes --docs, --bins, --contexts, "
                         "--depths, --trials, --digits, --seed")
    harness.add_argument("--tasks", help="harness tasks, comma-separated: heldout, passkey, needle, mqar (default: "
                         "heldout, passkey, needle; heldout, mqar for an MQAR run)")
    harness.add_argument("--text", help="a UTF-8 text file as the harness's documents (default: the heldout split)")
    harness.add_argument("--limit", type=int, help="lm-eval's limit: the first LIMIT rows of each task (a smoke "
                         "test: heldout's first bins of one document, not its measure; said in the JSON)")
    return parser


RETRIEVAL_DEFAULTS = {"trials": 20, "digits": 5, "seed": 0}


def run_command(args) -> dict:
    # the retrieval tasks' options that were given (None: not given): a task that does not use one refuses it
    retrieval = [(flag, value) for flag, value in (
        ("--contexts", args.contexts), ("--depths", args.depths), ("--trials", args.trials),
        ("--digits", args.digits), ("--seed", args.seed), ("--no-wandb", args.no_wandb or None)) if value is not None]
    for key, default in RETRIEVAL_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, default)
    if not args.harness:
        given = [flag for flag, value in (("--tasks", args.tasks), ("--text", args.text), ("--limit", args.limit))
                 if value is not None]
        if given:
            raise ValueError(f"{given[0]}: an option of --harness")
    if args.harness:
        if args.task != "heldout" or args.ctx is not None:
            raise ValueError("--harness: runs its own --tasks (give no --task, --ctx)")
        if args.micro_docs is not None or args.precision != "auto":  # lm-eval: one document a forward, fp32
            raise ValueError(f"{'--micro-docs' if args.micro_docs is not None else '--precision'}: not an option of "
                             f"--harness")
        if args.no_wandb:
            raise ValueError("--no-wandb: not an option of --harness (it adds nothing to wandb)")
        named = {t.strip() for t in (args.tasks or "").split(",") if t.strip()}
        if named and not named & {"passkey", "needle"} and retrieval:
            raise ValueError(f"{retrieval[0][0]}: an option of the harness's passkey and needle tasks (--tasks "
                             f"{args.tasks} has neither)")
        options = {k: v for k, v in (("docs", args.docs), ("bins", args.bins)) if v is not None}
        return evaluate_harness(args.run_dir, args.tasks, args.out, args.overrides, step=args.step,
                                device=args.device, limit=args.limit, text=args.text,
                                contexts=int_list("--contexts", args.contexts), depths=depth_list(args.depths),
                                trials=args.trials, digits=args.digits, seed=args.seed, **options)
    if args.task == "heldout":
        if retrieval:
            raise ValueError(f"{retrieval[0][0]}: an option of the retrieval tasks (--task passkey or needle)")
        return evaluate(args.run_dir, args.ctx, args.out, args.overrides, docs=args.docs, step=args.step,
                        bins=args.bins, micro_docs=args.micro_docs, device=args.device, precision=args.precision)
    given = [flag for flag, value in (("--ctx", args.ctx), ("--docs", args.docs), ("--bins", args.bins))
             if value is not None]
    if given:
        raise ValueError(f"{given[0]}: an option of the heldout task; retrieval tasks take --contexts, --depths, "
                         f"--trials")
    return evaluate_retrieval(args.run_dir, args.task, int_list("--contexts", args.contexts), depth_list(args.depths),
                              args.trials, args.digits, args.out, args.overrides, step=args.step,
                              micro_docs=args.micro_docs, device=args.device, precision=args.precision,
                              seed=args.seed, wandb=not args.no_wandb)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    setup_logging()  # warnings (a skipped checkpoint, ...) as `warning: ...` lines on stderr
    try:
        rec = run_command(args)
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)  # bad input: one line naming what is wrong, no traceback
        return 2
    except (FloatingPointError, OutputError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:   # one line, not a traceback through the forward it stopped
        print("interrupted by Ctrl-C before the result was written", file=sys.stderr)
        return 128 + signal.SIGINT
    out = Path(rec["out"])
    try:
        differs = provenance.differences_from_now(provenance.read(rec["run_dir"]), rec["run_dir"])
    except (ValueError, OSError):  # an unreadable record says nothing; the evaluation stands on its own
        differs = {}
    for key, (then, now) in differs.items():  # a result today may owe something to code the run was not trained with
        print(f"note: the run was trained with {key}={then}; this evaluation runs {now}")
    if rec["task"] == "harness":
        from longctx.hf.harness import result_lines
        print("\n".join(f"step {rec['step']}, {line}" for line in result_lines(rec)))
        print(f"wrote {out} (lm-eval's results); the export and the tasks: {out.with_suffix('')}")
    elif rec["task"] == "heldout":
        print(f"step {rec['step']} at ctx {rec['ctx']} (trained at {rec['train_ctx']}), {rec['docs']} docs: "
              f"{eval_line(rec)}")
        print(f"wrote {out}, {out.with_suffix('.npz')} and {out.with_suffix('.png')}")
    else:
        print(f"step {rec['step']}: {retrieval_line(rec)}")
        print(f"wrote {out} and {out.with_suffix('.png')}" + (f"; wandb: {rec['wandb']}" if rec.get("wandb") else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
