"""Reports that could state more than their evidence: a label joining two configs, a copied per-document file, an
evaluation record repeated, a run's launches ordered by file times, a seed still training averaged in without a word,
a group left out of the pairs without a word, a linked run folder skipped, code that differs between launches."""
from __future__ import annotations

import json
import os
import shutil
import time

import pytest
from omegaconf import OmegaConf
from report_fixtures import fake_run

from longctx.report import main
from longctx.report.findings import judge_record
from longctx.report.runs import (CODE_KEY, find_runs, load_run, provenance_differences, provenance_record,
                                 unevaluated_runs)

from test_report_hostile import interval_labels, paired_lines, run_cli


def seeds(folder, attention, offset, n=2, **kw):
    return [fake_run(folder / f"{attention}_s{s}", attention, 256, offset, seed=s, doc_bins=True, **kw)
            for s in range(n)]


def test_a_label_joining_two_configs_is_refused_before_anything_is_written(tmp_path, capsys):
    seeds(tmp_path / "runs", "exp", 0.0)
    seeds(tmp_path / "runs", "linear", 0.1)
    code, err = run_cli(capsys, tmp_path / "runs", "--out", tmp_path / "out", "--label", "linear=exp")
    assert code == 2 and len(err) == 1, err
    assert "label 'exp'" in err[0] and "seed" in err[0] and "one config" in err[0]
    assert not (tmp_path / "out").exists()


def test_a_record_whose_label_holds_two_configs_is_refused_by_the_findings(tmp_path):
    seeds(tmp_path / "runs", "exp", 0.0, n=1)
    seeds(tmp_path / "runs", "linear", 0.1, n=1)
    main([str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--record", str(tmp_path / "rec" / "r.json")])
    record = json.loads((tmp_path / "rec" / "r.json").read_text())
    for entry in record["runs"]:      # edited by hand: both runs under one label, other seeds
        entry["seed_label"] = entry["label"] = "exp"
    record["runs"][1]["seed"] = 1
    with pytest.raises(ValueError, match="label 'exp': runs .* differ in their config"):
        judge_record(record, tmp_path / "rec", "r")


def test_a_per_document_file_copied_from_another_run_is_one_line_naming_it(tmp_path, capsys):
    exp = fake_run(tmp_path / "runs" / "exp", "exp", 256, 0.0, doc_bins=True)
    lin = fake_run(tmp_path / "runs" / "lin", "linear", 256, 0.1, doc_bins=True)
    shutil.copy(exp / "eval" / "step_00000020.npz", lin / "eval" / "step_00000020.npz")
    code, err = run_cli(capsys, tmp_path / "runs", "--out", tmp_path / "out")
    assert code == 2 and str(lin / "eval" / "step_00000020.npz") in err[-1], err
    assert "not this evaluation's per-document record" in err[-1]
    assert not (tmp_path / "out").exists()


def test_a_best_context_loss_none_of_the_curves_bins_is_refused(tmp_path, capsys):
    run = fake_run(tmp_path / "runs" / "exp", "exp", 256, 0.0, doc_bins=True)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    last = json.loads(lines[-1])
    last["best_context_loss"] = float("nan")    # a finite curve with a NaN summary: edited, not diverged
    (run / "metrics.jsonl").write_text("\n".join(lines[:-1] + [json.dumps(last)]) + "\n")
    code, err = run_cli(capsys, tmp_path / "runs", "--out", tmp_path / "out")
    assert code == 2 and f"{run / 'metrics.jsonl'}:2" in err[-1] and "best_context_loss nan" in err[-1], err


def test_repeated_evaluation_records_are_refused_naming_the_line(tmp_path, capsys):
    run = fake_run(tmp_path / "runs" / "exp", "exp", 256, 0.0, doc_bins=True)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(lines + [lines[-1]]) + "\n")
    code, err = run_cli(capsys, tmp_path / "runs", "--out", tmp_path / "out")
    assert code == 2 and f"{run / 'metrics.jsonl'}:3: step 20 after step 20 (line 2)" in err[-1], err


def _resumed(folder):
    """A run of max_steps 20 resumed at step 20 to max_steps 40, stopped at step 30 (its records so far)."""
    run = fake_run(folder, "exp", 256, 0.0, steps=(10, 20, 30))
    cfg = OmegaConf.load(run / "config.yaml")
    cfg.trainer.max_steps = 40
    OmegaConf.save(cfg, run / "config.resume_step20.yaml")
    cfg.trainer.max_steps = 20
    OmegaConf.save(cfg, run / "config.yaml")
    return run


def test_a_copy_that_does_not_keep_file_times_is_still_unfinished(tmp_path):
    run = _resumed(tmp_path / "run")
    assert load_run(run).status == "unfinished: step 30 of trainer.max_steps=40"
    later = time.time() + 100                    # the first launch's config now looks newest
    os.utime(run / "config.yaml", (later, later))
    assert load_run(run).status == "unfinished: step 30 of trainer.max_steps=40"


def test_the_provenance_record_names_the_newest_launchs_config(tmp_path):
    """Two launches from one step: the record's config_file decides, not which file was touched last."""
    run = _resumed(tmp_path / "run")
    cfg = OmegaConf.load(run / "config.resume_step20.yaml")
    cfg.trainer.max_steps = 30
    OmegaConf.save(cfg, run / "config.resume_step20.launch2.yaml")
    earlier = time.time() - 100
    os.utime(run / "config.resume_step20.launch2.yaml", (earlier, earlier))
    assert load_run(run).status == "unfinished: step 30 of trainer.max_steps=40"
    (run / "provenance.json").write_text(json.dumps({"launches": [{"config_file": "config.yaml"},
                                                                  {"config_file": "config.resume_step20.launch2.yaml"}]}))
    assert load_run(run).status == "complete"


def test_an_unfinished_seed_is_marked_in_the_intervals_and_pairs(tmp_path):
    seeds(tmp_path / "runs", "exp", 0.0)
    fake_run(tmp_path / "runs" / "linear_s0", "linear", 256, 0.1, seed=0, doc_bins=True)
    fake_run(tmp_path / "runs" / "linear_s1", "linear", 256, 0.1, seed=1, doc_bins=True, steps=(10,), max_steps=20)
    report = main([str(tmp_path / "runs"), "--out", str(tmp_path / "out")]).read_text()
    assert interval_labels(report) == ["exp (2 seeds)", "linear (2 seeds) (unfinished: linear_s1)"]
    (row,) = paired_lines(report)
    assert row.startswith("| exp (2 seeds) | linear (2 seeds) (unfinished: linear_s1) |")
    intervals = json.loads((tmp_path / "out" / "intervals.json").read_text())
    assert [g["unfinished"] for g in intervals["groups"]] == [[], ["linear_s1"]]
    assert intervals["paired"][0]["unfinished"] == ["linear_s1"]


def test_a_group_without_its_per_document_records_is_named_among_the_unpaired(tmp_path):
    seeds(tmp_path / "runs", "exp", 0.0)
    seeds(tmp_path / "runs", "linear", 0.1)
    (tmp_path / "runs" / "linear_s1" / "eval" / "step_00000020.npz").unlink()
    report = main([str(tmp_path / "runs"), "--out", str(tmp_path / "out")]).read_text()
    assert paired_lines(report) == []
    assert "- not paired: linear (2 seeds): linear_s1 has no usable per-document record" in report


def test_a_linked_run_folder_in_a_sweep_is_found_once(tmp_path):
    run = fake_run(tmp_path / "elsewhere" / "exp_s0", "exp", 256, 0.0)
    sweep = tmp_path / "sweep"
    fake_run(sweep / "linear_s0", "linear", 256, 0.1)
    (sweep / "exp_s0").symlink_to(run, target_is_directory=True)
    (sweep / "loop").symlink_to(sweep, target_is_directory=True)   # a link back up is not walked twice
    starting = sweep / "starting"
    starting.mkdir()
    (starting / "train.log").write_text("")
    (starting / "config.yaml").write_text("ctx: 1\n")
    assert find_runs([sweep]) == [run.resolve(), (sweep / "linear_s0").resolve()]
    assert unevaluated_runs([sweep]) == [starting]


def _provenance(run, launches, diffs=None):
    """Write a provenance record (and its diff files) into a loaded run's folder, and read it as load_run does."""
    for name, text in (diffs or {}).items():
        (run.path / name).write_text(text)
    (run.path / "provenance.json").write_text(json.dumps({**launches[0], "launches": launches}))
    run.provenance = provenance_record(run.path)


def test_code_that_differs_between_launches_or_uncommitted_edits_is_listed(tmp_path):
    runs = [load_run(fake_run(tmp_path / f"exp_s{s}", "exp", 256, 0.0, seed=s)) for s in range(3)]
    for run in runs:
        run.name = run.path.name
    clean = {"git": {"commit": "a" * 40, "dirty": False}}
    _provenance(runs[0], [clean])
    _provenance(runs[1], [clean, {"git": {"commit": "b" * 40, "dirty": False}}])   # resumed under other code
    assert provenance_differences(runs[:2])[CODE_KEY] == {"exp_s0": "a" * 12, "exp_s1": "a" * 12 + " -> " + "b" * 12}
    edited = {"git": {"commit": "a" * 40, "dirty": True, "diff_file": "provenance.diff"}}
    _provenance(runs[1], [edited], {"provenance.diff": "one edit"})
    _provenance(runs[2], [edited], {"provenance.diff": "another edit"})
    code = provenance_differences(runs[1:])[CODE_KEY]
    assert code["exp_s1"] != code["exp_s2"] and all("+diff " in c for c in code.values())
    _provenance(runs[2], [edited], {"provenance.diff": "one edit"})
    assert CODE_KEY not in provenance_differences(runs[1:])


def test_the_newest_retrieval_result_of_a_step_is_shown_and_a_cut_one_is_named(tmp_path, capsys):
    from longctx.report.retrieval import newest_results

    run = fake_run(tmp_path / "runs" / "exp", "exp", 256, 0.0)
    result = {"task": "passkey", "step": 20, "contexts": [64], "depths": [0.5], "trials": 4, "digits": 5,
              "chance": {"digit": 0.1, "key": 1e-5}, "mean_key_accuracy": 0.25}
    (run / "eval").mkdir()
    (run / "eval" / "passkey-step20.json").write_text(json.dumps(result))
    (run / "eval" / "passkey-step20-2.json").write_text(json.dumps({**result, "trials": 20}))
    (run / "eval" / "passkey-step10-3.json").write_text(json.dumps({**result, "step": 10}))
    assert [r["trials"] for r in newest_results(run)] == [20]
    (run / "eval" / "passkey-step20-3.json").write_text('{"task": "passkey", "st')
    with pytest.raises(ValueError, match="passkey-step20-3.json: not a readable retrieval result"):
        newest_results(run)
    (run / "eval" / "passkey-step20-3.json").write_text(json.dumps({"task": "passkey", "step": 20}))
    code, err = run_cli(capsys, tmp_path / "runs", "--out", tmp_path / "out")
    assert code == 2 and "passkey-step20-3.json: not a retrieval result (no 'contexts')" in err[-1], err


def test_code_now_and_its_differences_from_a_run(tmp_path):
    from longctx import provenance

    now = provenance.code_now()
    assert set(now) == {"commit", "dirty", "diff_sha256", "longctx"}
    record = {"git": {"commit": now["commit"], "dirty": True, "diff_file": "provenance.diff"},
              "versions": {}}
    (tmp_path / "provenance.diff").write_text("an edit this checkout does not hold")
    differs = provenance.differences_from_now(record, tmp_path)
    if now["commit"] is not None:   # inside a git checkout (CI's clone is one)
        then, current = differs["git.diff"]
        assert then == provenance.diff_digest(b"an edit this checkout does not hold")
        assert current == (now["diff_sha256"] or "none")
    record["git"]["dirty"] = False        # trained clean: a dirty checkout now is a difference, a clean one none
    assert ("git.diff" in provenance.differences_from_now(record, tmp_path)) == bool(now["dirty"])
