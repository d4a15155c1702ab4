"""lm-eval-harness tasks from a run's own data, generated offline into a folder, and a runner.

    python -m longctx.hf.harness RUN_DIR --out tasks/            # heldout, passkey, needle (mqar for an MQAR run)
    python -m longctx.hf.harness EXPORT_DIR --text notes.txt --out tasks/ --tasks heldout,passkey
    HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 lm_eval --model hf \\
        --model_args pretrained=EXPORT_DIR,trust_remote_code=True,max_length=CTX+1 \\
        --tasks longctx_heldout,longctx_passkey --include_path tasks/

The folder holds, per task, longctx_<task>.yaml (the template shipped beside this file, plus the data file and the
metrics) and longctx_<task>.jsonl (its documents: `tasks.py` says what each holds). The YAMLs name their callbacks
as `!function longctx.hf.harness.metrics...`: the folder itself holds no code. Documents come from the run's heldout
split (the first documents, as `python -m longctx.evaluate` reads them) decoded with the tokenizer an export of the
run carries (`longctx.hf.export.run_tokenizer`), or from a local text file cut into documents of the context length;
an export folder as the source gives its tokenizer and context and needs `--text`. Data without text (MQAR, the ICL
Markov states) is written as its ids' numbers, and the folder keeps the tokenizer that reads them (`tokenizer=`).
A run's data that now holds ids of another tokenizer than the run recorded at its first launch is refused in one line,
as evaluate refuses it (`longctx.runs.check_data_tokens`).
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path

import numpy as np

from longctx.hf.configuration import require
from longctx.hf.harness.tasks import (PREFIX, TASKS, Codec, TaskData, check_out_folder, heldout_task,
                                      id_tokenizer, mqar_task, summary_line, retrieval_task, text_alphabet,
                                      write_task)

DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)   # longctx.evaluate's


class Source:
    """Where the documents and the tokenizer come from: a run folder, or an export folder with a text file."""

    def __init__(self, path, text=None, ctx: int | None = None):
        self.path = Path(path).expanduser()
        if not self.path.is_dir():
            raise FileNotFoundError(f"source={str(path)!r}: not a folder (a run folder, or an exported model)")
        self.cfg, self.text_file = None, None if text is None else Path(text).expanduser()
        exported = self.path / "config.json"
        run = (self.path / "config.yaml").is_file() or (self.path / "checkpoints").is_dir()
        facts = json.loads(exported.read_text()) if not run and exported.is_file() else {}
        if run:
            self._run()
        elif facts.get("model_type") == "longctx":
            self._export(facts)
        else:
            raise ValueError(f"source={str(path)!r}: neither a run folder (config.yaml, checkpoints/) nor an exported "
                             f"longctx model (config.json of model_type longctx)")
        self.ctx = ctx or self.ctx
        if self.text_file is not None and not self.text_file.is_file():
            raise FileNotFoundError(f"--text={str(text)!r}: no such file")

    def _run(self) -> None:
        from omegaconf import OmegaConf

        from longctx.hf.export import run_tokenizer
        from longctx.runs import pick_checkpoint, run_config

        config = self.path / "config.yaml"
        self.cfg = OmegaConf.load(config) if config.is_file() else run_config(self.path, pick_checkpoint(self.path,
                                                                                                          None)[2])
        self.ctx, self.bins = int(self.cfg.ctx), int(self.cfg.trainer.icl_bins)
        tokenizer, self.tokenizer_note = run_tokenizer(self.path, self.cfg)
        self.data, self.ids = self.cfg.data.name, tokenizer is None
        if tokenizer is None:  # ids without text: written as numbers, read back by the tokenizer the folder keeps
            info = self.splits(self.ctx).info
            tokenizer = id_tokenizer(int(info["vocab_size"]), int(info["bos_id"]))
        self.codec = Codec(tokenizer)

    def _export(self, facts: dict) -> None:
        from transformers import PreTrainedTokenizerFast

        self.ctx, self.bins, self.data, self.ids = int(facts["ctx"]), 16, "text", False
        if self.text_file is None:
            raise ValueError(f"source={str(self.path)!r}: an exported model holds no data; give --text FILE (or the "
                             f"run folder, whose heldout split is used)")
        if not (self.path / "tokenizer.json").is_file():
            raise ValueError(f"source={str(self.path)!r}: has no tokenizer.json (its run's data has no text); "
                             f"lm-eval reads text")
        self.codec = Codec(PreTrainedTokenizerFast.from_pretrained(str(self.path)))  # a JSON file: runs no code
        self.tokenizer_note = f"the tokenizer of {self.path.name}"

    def need_text(self, task: str) -> Codec:
        if task in ("passkey", "needle") and self.ids:
            raise ValueError(f"--tasks {task}: the run's data has no text ({self.tokenizer_note}); the passkey "
                             f"prompts are words (python -m longctx.evaluate --task {task} scores id prompts)")
        return self.codec

    def splits(self, ctx: int):
        """The run's data at `ctx`, refused where it now holds ids of another tokenizer than the run trained on
        (longctx.runs.check_data_tokens, as evaluate checks it): its documents would not be what the model read."""
        from longctx.generate import recorded_tokens
        from longctx.runs import check_data_tokens
        from longctx.train.data import resolve_splits

        splits = resolve_splits(self.cfg.data, ctx)
        advice = ("its data has no text, so --text cannot stand in: restore the data it trained on" if self.ids else
                  "give --text FILE: documents of your own text, read with the run's tokenizer")
        check_data_tokens(self.path, splits.heldout_path, recorded_tokens(self.path), advice)
        return splits

    def documents(self, ctx: int, n: int) -> tuple[np.ndarray, dict]:
        """The first `n` documents (fewer where there are fewer) of `ctx` tokens -> (ids (n, ctx) int64, the
        heldout batch's other fields: MQAR's queries)."""
        if self.text_file is not None:
            ids = np.asarray(self.need_text("heldout").encode(self.text_file.read_text(encoding="utf-8")), np.int64)
            k = min(n, len(ids) // ctx)
            if k < 1:
                raise ValueError(f"--text={str(self.text_file)!r}: {len(ids)} tokens, fewer than one document of "
                                 f"{ctx}")
            return ids[:k * ctx].reshape(k, ctx), {}
        from longctx.data import dataset_info, heldout_batch

        splits = self.splits(ctx)
        n = min(n, dataset_info(splits.heldout_path)["num_docs"])
        batch = heldout_batch(str(splits.heldout_path), ctx, n)
        return batch["targets"].numpy(), batch


def positive(flag: str, value, least: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{flag}={value!r}: must be an integer >= {least}")


def task_list(text: str | None, source: Source) -> list[str]:
    """--tasks: names of TASKS (with or without the longctx_ prefix), comma-separated; default by the data."""
    if text is None:
        return ["heldout", "mqar"] if source.data == "mqar" else ["heldout"] if source.ids else [
            "heldout", "passkey", "needle"]
    names = [t.strip().removeprefix(PREFIX) for t in text.split(",") if t.strip()]
    bad = [t for t in names if t not in TASKS]
    if bad or not names:
        raise ValueError(f"--tasks={text!r}: expected some of {', '.join(TASKS)}, comma-separated")
    if "mqar" in names and source.data != "mqar":
        raise ValueError(f"--tasks={text!r}: mqar needs an MQAR run (this one's data is {source.data})")
    return list(dict.fromkeys(names))


def generate(source, out, tasks: str | None = None, *, text=None, ctx: int | None = None, docs: int = 8,
             bins: int | None = None, contexts: list[int] | None = None, depths: list[float] | None = None,
             trials: int = 20, digits: int = 5, seed: int = 0) -> dict:
    """Write the tasks into the new folder `out` -> {"out", "tasks": [lm-eval names], "notes": [one line each]}.
    Every argument is checked before anything is written; a failure midway removes what was written."""
    import shutil

    require("lm_eval", what="longctx.hf.harness")
    for flag, value in (("--docs", docs), ("--trials", trials), ("--digits", digits)):
        positive(flag, value)
    positive("--seed", seed, least=0)
    for flag, value in (("--ctx", ctx), ("--bins", bins)):
        if value is not None:
            positive(flag, value, least=2 if flag == "--ctx" else 1)
    out = Path(out).expanduser()
    check_out_folder(out)
    source = Source(source, text, ctx)
    names = task_list(tasks, source)
    made = []
    for task in names:
        codec = source.need_text(task)
        if task == "heldout":
            made.append(heldout_task(codec, source.documents(source.ctx, docs)[0], bins or source.bins))
        elif task == "mqar":
            documents, batch = source.documents(source.ctx, docs)
            made.append(mqar_task(codec, documents, batch["queries"].numpy()))
        else:
            made.append(retrieval_data(task, source, codec, contexts, depths, trials, digits, seed))
    out.mkdir(parents=True, exist_ok=True)
    try:
        for data in made:
            write_task(data, out, str(source.path))
        if source.ids:
            source.codec.tokenizer.save_pretrained(str(out))  # tokenizer.json and its config: data, no code
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    # the most tokens a row feeds (BOS and its document or prompt, generated tokens included): lm-eval cuts the left
    # of anything longer, so a passkey past the model's ctx would be scored on a prompt without its needle
    longest = max([source.ctx, *(max(d.notes["contexts"]) for d in made if "contexts" in d.notes)])
    return {"out": str(out), "tasks": [PREFIX + d.task for d in made], "notes": [summary_line(d) for d in made],
            "data": {d.task: d.notes for d in made}, "tokenizer": str(out) if source.ids else None,
            "max_length": longest + 1}


def retrieval_data(task: str, source: Source, codec: Codec, contexts, depths, trials: int, digits: int,
                   seed: int) -> TaskData:
    """passkey or needle as `python -m longctx.evaluate --task TASK` builds it (same defaults, same prompts)."""
    vocab = len(codec.tokenizer)
    longest = max(contexts or [source.ctx])
    alphabet = text_alphabet(codec, vocab, longest, seed)
    shortest = 2 * (len(alphabet.marker) + digits) + 1
    if contexts is None:
        contexts = [c for c in (source.ctx // 4, source.ctx // 2, source.ctx) if c >= shortest] or [source.ctx]
    if any(c < shortest for c in contexts):
        raise ValueError(f"--contexts: {min(contexts)} is shorter than a prompt's two copies of marker "
                         f"({len(alphabet.marker)} tokens) + key ({digits}) + 1 token of haystack; use contexts "
                         f">= {shortest}")
    documents = None
    if task == "needle":
        documents = source.documents(max(contexts), 2 * trials + 16)[0]
    return retrieval_task(task, codec, alphabet, sorted(set(contexts)), sorted(set(depths or DEFAULT_DEPTHS)),
                          trials, digits, seed, documents)


def run_lm_eval(model_dir, task_dir, tasks: list[str], limit: int | None = None, batch_size: int = 1,
                device: str = "cpu", max_length: int | None = None, log_samples: bool = False,
                tokenizer=None) -> dict:
    """lm-eval's `simple_evaluate` on the exported model `model_dir` (its "hf" model) with the
    tasks of `task_dir` only (lm-eval's own are not indexed) -> its results dict (lm-eval's `results`, `configs`,
    `versions`, ...; `samples` with log_samples). max_length (default: the model's ctx + 1, BOS and ctx tokens as
    longctx reads a document): what lm-eval feeds at most, generated tokens included. tokenizer: a folder holding
    the tokenizer (the task folder, for data without text), default the model's."""
    require("lm_eval", what="longctx.hf.harness")
    import lm_eval
    from lm_eval.tasks import TaskManager

    ctx = json.loads((Path(model_dir) / "config.json").read_text())["ctx"]
    # longctx.hf registered the model classes in this process: no code from the folder runs
    args = {"pretrained": str(model_dir), "trust_remote_code": False, "backend": "causal", "device": device,
            "dtype": "float32", "max_length": max_length or ctx + 1}
    if tokenizer is not None:
        args["tokenizer"] = str(tokenizer)
    manager = TaskManager(include_path=str(task_dir), include_defaults=False)
    with quiet_git_hash():
        return lm_eval.simple_evaluate(model="hf", model_args=args, tasks=list(tasks), limit=limit,
                                       batch_size=batch_size, task_manager=manager, log_samples=log_samples,
                                       bootstrap_iters=0)


def git_hash_quietly() -> str | None:
    """`git describe --always` of the working folder, as lm-eval records it in its results; where git fails or is
    missing, lm-eval's own fallback (the commit read from .git, None outside a repository). Git's "fatal: not a git
    repository" stays off the console, where lm-eval's call prints it."""
    from lm_eval.loggers.utils import get_commit_from_path
    try:
        out = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True, check=False)
    except OSError:          # no git on this machine
        out = None
    if out is not None and out.returncode == 0 and out.stdout.strip():
        return out.stdout.strip()
    return get_commit_from_path(os.getcwd())


@contextlib.contextmanager
def quiet_git_hash():
    """lm-eval's evaluator asks git for the working folder's commit with git's errors on the console: within this
    block it asks git_hash_quietly instead."""
    import lm_eval.evaluator as evaluator
    original = evaluator.get_git_commit_hash
    evaluator.get_git_commit_hash = git_hash_quietly
    try:
        yield
    finally:
        evaluator.get_git_commit_hash = original


def evaluate_run(run_dir, folder, tasks: str | None = None, step: int | None = None, device: str = "cpu",
                 limit: int | None = None, **options) -> dict:
    """`python -m longctx.evaluate RUN --harness`: export the run (its newest checkpoint, or `step`'s) to
    folder/model, write its tasks (`generate`'s `options`) to folder/tasks, run lm-eval on them -> the record
    (lm-eval's results, versions and n-samples, and where the model and tasks are). `folder` must not exist yet."""
    require("lm_eval", what="longctx.evaluate --harness")
    from lm_eval.utils import handle_non_serializable

    from longctx.hf.export import export_run
    folder = Path(folder)
    if folder.exists():
        raise FileExistsError(f"{folder}: exists and is never written over")
    try:
        summary = generate(run_dir, folder / "tasks", tasks, **options)  # checks the arguments before the export
        model_dir = export_run(run_dir, folder / "model", step=step)
        result = run_lm_eval(model_dir, folder / "tasks", summary["tasks"], limit=limit, device=device,
                             tokenizer=summary["tokenizer"], max_length=summary["max_length"])
    except BaseException:
        import shutil
        shutil.rmtree(folder, ignore_errors=True)  # made here (it did not exist): nothing half-done stays
        raise
    keep = {key: result.get(key) for key in ("results", "versions", "n-samples", "higher_is_better")}
    keep = json.loads(json.dumps(keep, default=handle_non_serializable))
    return {"task": "harness", "tasks": summary["tasks"], "model": str(model_dir), "task_dir": summary["out"],
            "max_length": summary["max_length"], "limit": limit, "documents": summary["notes"], "lm_eval": keep}


def result_lines(record: dict) -> list[str]:
    """One line per task: its metrics (the cells left out), as `evaluate` prints them."""
    lines = []
    for task, metrics in record["lm_eval"]["results"].items():
        shown = [f"{k.split(',')[0]} {v:.4f}" for k, v in metrics.items() if isinstance(v, float)
                 and k.split(",")[0] in ("nll", "bits_per_byte", "exact_match", "acc")]
        lines.append(f"{task}: {', '.join(shown)}")
    return lines


__all__ = ["TASKS", "PREFIX", "Source", "generate", "run_lm_eval", "evaluate_run", "result_lines"]
