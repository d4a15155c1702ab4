"""Compact report records: what the report's figures show, kept small enough to commit beside the figures, so
`python scripts/plot_results.py` redraws them without the run folders.

    {"kind": "report", "title": "...", "figures": {"icl_curves": "NAME_icl.png", ...},
     "runs": [{"name", "label", "seed_label", "seed", "ctx", "heldout", "status",
               "records": [{"step", "flops", "best_context_loss", "icl_curve", "bayes_curve"}, ...],
               "doc_bins": "NAME.npz#r<i>_" (the final evaluation's per-document record: arrays r<i>_loss, ...
                            of one compressed file beside the JSON for all runs, when small; on recall data
                            r<i>_hits, documents x queries, 1 where the query was recalled)}],
     "retrieval": [{"run", "label", "seed", "task", "step", "key_accuracy", ...}, ...]  (report.retrieval; only
                  when a run has a retrieval result),
     "recall": [{"label", "attention", "p", "window", "state", "n_pairs", "chance", "seeds": [accuracy, ...]}, ...]
               (report.recall.recall_points: one per group of seeds that measured recall)}

`heldout` names the runs' heldout data (runs sharing it share documents and optimum); `seed_label` groups seeds;
`code` is the code of each run's launches (runs.launches_code: commit, '+diff <digest>' when dirty; null without a
provenance record), which the findings name when a claim's runs differ in it.

A record can carry an earlier one (`read_carried`, the report's `--carry`): its runs, per-document arrays, recall
points and retrieval results go into the new record beside the new runs', as they were written (a sweep that grows
over several machines keeps one record without keeping every run folder). A run may stand in one of them only.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

from longctx.report import figures
from longctx.report.manifest import write_listed
from longctx.report.recall import run_hits
from longctx.report.runs import (Run, check_record_labels, config_digest, group_runs, launches_code,
                                 runs_from_record)

RECORD_KEYS = ("step", "flops", "tokens", "flops_all_stages", "tokens_all_stages", "epochs", "heldout_minus_train",
               "best_context_loss", "last10_loss", "icl_curve", "bayes_curve", "recall_accuracy", "recall_chance")
MAX_DOC_BINS_BYTES = 4 * 1024 * 1024   # larger per-document records stay in the run folders
FIGURES = ("icl_curves", "gap_to_optimum", "paired_differences", "best_context_vs_flops", "best_context_vs_context",
           "recall_vs_state")


def _heldout_name(run: Run) -> str:
    return ", ".join(f"{k}={v}" for k, v in run.heldout_key[1:])  # the context is the entry's own ctx


def read_carried(path: Path) -> dict:
    """A committed record to carry into a new one: {"path", "record", "arrays"} (its JSON, and the per-document
    arrays of the npz beside it when there is one; read without unpickling). ValueError naming the file when it is
    not a report record."""
    path = Path(path)
    if path.suffix != ".json" or not path.is_file():
        raise ValueError(f"--carry {path}: give a report record (.json) that exists")
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"--carry {path}: not JSON ({err})") from None
    if not isinstance(record, dict) or record.get("kind") != "report" or not isinstance(record.get("runs"), list):
        raise ValueError(f"--carry {path}: not a report record (kind 'report' with a list of runs)")
    arrays = {}
    if path.with_suffix(".npz").exists():
        with np.load(path.with_suffix(".npz"), allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    for entry in record["runs"]:  # every named per-document record is there, before anything is written
        prefix = str(entry.get("doc_bins") or "").partition("#")[2]
        if entry.get("doc_bins") and not any(k.startswith(prefix) for k in arrays):
            raise ValueError(f"--carry {path}: run {entry['name']}'s per-document arrays ({entry['doc_bins']}) are "
                             f"not in {path.with_suffix('.npz')}")
    return {"path": path, "record": record, "arrays": arrays}


def check_carried(carried: list[dict], runs: list) -> None:
    """ValueError when a run stands in two carried records, or in one and among the runs reported: one run, one entry.
    A reported run is a carried one when its folder ends in the carried name and its last record is the carried
    run's (a run elsewhere that shares the name's folders is another run: the report names it apart)."""
    seen: dict[str, str] = {}
    for c in carried:
        for entry in c["record"]["runs"]:
            if entry["name"] in seen:
                raise ValueError(f"--carry {c['path']}: run {entry['name']} is also in {seen[entry['name']]}; "
                                 f"carry or report each run once")
            seen[entry["name"]] = str(c["path"])
            if any(_same_run(run, entry) for run in runs):
                raise ValueError(f"--carry {c['path']}: run {entry['name']} is also among the runs reported; "
                                 f"carry or report each run once")


def _same_run(run, entry: dict) -> bool:
    """The carried entry is this run: its folders end in the entry's name and the entry's evaluations begin the run's
    own (the same steps and results; a run that evaluated again since the record was written is still the same)."""
    carried = entry.get("records") or []
    same = ("step", "tokens", "flops", "best_context_loss", "recall_accuracy")
    return ("/" + run.path.as_posix()).endswith("/" + entry["name"]) and 0 < len(carried) <= len(run.records) and all(
        mine.get(key) == theirs.get(key) for mine, theirs in zip(run.records, carried) for key in same)


def carried_entries(carried: list[dict], key: str) -> list[dict]:
    """The carried records' entries under `key` ("recall", "retrieval"), in order."""
    return [e for c in carried for e in c["record"].get(key, [])]


def write_record(runs: list[Run], title: str, path: Path, figure_names: dict[str, str],
                 retrieval: list[dict] | None = None, recall: list[dict] | None = None,
                 carried: list[dict] = (), listed_in: Path | None = None) -> Path:
    """The compact record of labelled runs (label_runs first), with each final per-document record beside it, and
    the runs' retrieval results (report.retrieval.retrieval_entries) and recall points (report.recall.recall_points)
    when there are any -- those of the `carried` records (read_carried) included by the caller. The carried records'
    runs come first, as they were written, their per-document arrays renumbered into this record's npz. Both files
    are listed in `listed_in`'s .report_files.json (the report's --out; default the record's folder) before either
    is written (report.manifest), so a later report knows a pair an interrupted write left as its own."""
    path = Path(path)
    out = {"kind": "report", "title": title, "figures": figure_names, "runs": []}
    npz, arrays = path.with_suffix(".npz"), {}
    for c in carried:
        for entry in c["record"]["runs"]:
            entry = json.loads(json.dumps(entry))  # a copy: the carried record stays as read
            name = entry.get("doc_bins")
            prefix = f"r{len(out['runs'])}_"
            if name:
                old = str(name).partition("#")[2]   # read_carried checked that they are there
                arrays.update({prefix + k[len(old):]: v for k, v in c["arrays"].items() if k.startswith(old)})
                entry["doc_bins"] = entry["records"][-1]["doc_bins"] = f"{npz.name}#{prefix}"
            out["runs"].append(entry)
    for run in runs:
        i = len(out["runs"])
        entry = {"name": run.name, "label": run.label, "seed_label": run.seed_label, "seed": run.seed,
                 "config": config_digest(run), "code": launches_code(run),
                 "ctx": run.ctx, "attention": run.tag, "heldout": _heldout_name(run), "status": run.status,
                 "records": [{k: r[k] for k in RECORD_KEYS if k in r} for r in run.records]}
        docs = run.doc_bins(run.final)
        if docs is not None:
            prefix = f"r{i}_"
            arrays.update({prefix + "loss": docs.loss.astype(np.float32), prefix + "edges": docs.edges,
                           prefix + "doc_index": docs.doc_index})
            if docs.bayes is not None:
                arrays[prefix + "bayes"] = docs.bayes.astype(np.float32)
            found = run_hits(run)
            if found is not None:  # recall data: whether each query was recalled (its accuracy recomputes from it)
                arrays[prefix + "hits"] = found[0].astype(np.uint8)
            entry["doc_bins"] = entry["records"][-1]["doc_bins"] = f"{npz.name}#{prefix}"
        out["runs"].append(entry)
    packed = _npz_bytes(arrays) if arrays else None
    if packed is not None and len(packed) > MAX_DOC_BINS_BYTES:  # too large to commit: figures without intervals
        packed = None
        npz.unlink(missing_ok=True)  # an earlier record's, checked replaceable
        for entry in out["runs"]:
            entry.pop("doc_bins", None)
            entry["records"][-1].pop("doc_bins", None)
    if retrieval:
        out["retrieval"] = retrieval
    if recall:
        out["recall"] = recall
    # the npz first, the JSON that names it last; both listed (report.manifest) before either is written
    files = {**({npz: packed} if packed is not None else {}), path: (json.dumps(out, indent=1) + "\n").encode()}
    write_listed(path.parent if listed_in is None else listed_in, files)
    return path


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """The compressed npz of `arrays`, in memory: its size decides whether it is written at all."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


def draw_record(record: dict, folder: Path, n_boot: int = 2000, name: str | None = None) -> dict:
    """{figure kind: matplotlib figure} of the kinds the record lists (a kind with nothing to show is left out).
    `claims` (the paper's claims this record tests, `longctx.report.findings`) needs the record's file name."""
    source = f"{name}.json" if name else "the report record"
    check_record_labels(record, source)
    runs = runs_from_record(record, folder, source)
    groups = group_runs(runs)
    title = record["title"]
    drawn = {}
    for kind in record["figures"]:
        if kind == "icl_curves":
            drawn[kind] = figures.draw_icl_overlay(groups, runs, title, None, n_boot)
        elif kind == "gap_to_optimum":
            drawn[kind] = figures.draw_gap_to_optimum(groups, title, None, n_boot)
        elif kind == "claims":
            from longctx.report.findings import draw_claims, judge_record

            if name is None:
                raise ValueError("figures: claims needs the record's file name (its findings are keyed by it)")
            drawn[kind] = draw_claims(judge_record(record, folder, name, n_boot=n_boot), title)
        elif kind == "recall_vs_state":
            from longctx.report.recall import draw_recall_vs_state

            drawn[kind] = draw_recall_vs_state(record.get("recall", []), title)
            if drawn[kind] is None:
                raise ValueError(f"figures: recall_vs_state needs the record's recall points; {title!r} has none")
        elif kind in ("paired_differences", "best_context_vs_flops", "best_context_vs_context"):
            fig = {"paired_differences": lambda: figures.draw_paired_differences(groups, title, n_boot),
                   "best_context_vs_flops": lambda: figures.draw_best_vs_flops(groups, title),
                   "best_context_vs_context": lambda: figures.draw_best_vs_context(groups, title)}[kind]()
            if fig is not None:
                drawn[kind] = fig
        else:
            raise ValueError(f"figures: unknown kind {kind!r} (kinds: {', '.join(FIGURES)}, claims)")
    return drawn
