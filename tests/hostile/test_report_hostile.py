"""python -m longctx.report and scripts/plot_results.py on hostile input: runs on other data, copied runs, damaged
records, outputs aimed at other runs' files. Each ends in one line naming the field, value or file, a non-zero exit
and nothing written; or, for runs on other data, in separate arms with the pairing refused and the reason given."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from omegaconf import OmegaConf
from report_fixtures import fake_run

from longctx.report import main


def run_cli(capsys, *args):
    """main() in this process: (exit code, stderr lines)."""
    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in args])
    return exit_.value.code, capsys.readouterr().err.strip().splitlines()


def files_under(folder) -> dict:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def section(report: str, heading: str) -> list[str]:
    """The table rows (not the header) of a report section; [] when the report has no such section."""
    if f"## {heading}" not in report:
        return []
    lines = report.split(f"## {heading}")[1].split("\n## ")[0].splitlines()
    return [line for line in lines if line.startswith("| ")][1:]


def interval_labels(report: str) -> list[str]:
    return [line.split("|")[1].strip() for line in section(report, "Intervals")]


def paired_lines(report: str) -> list[str]:
    return section(report, "Paired differences")


def identity(heldout_digest: str, train_digest: str = "t" * 64) -> dict:
    """A data_identity.json as a run records it at its first launch (longctx.data.identity)."""
    return {"id": (heldout_digest + train_digest)[:16],
            "train": {"digest": train_digest, "hashed": "all", "attrs": {"tokenizer": None}},
            "heldout": {"digest": heldout_digest, "hashed": "all", "attrs": {"tokenizer": None}}}


# ----- runs on other data are other arms, never paired ------------------------------------------------------

def test_runs_on_other_prepared_datasets_are_two_arms_not_two_seeds(tmp_path, caplog):
    """Same config but data.path (and seed): two datasets, so two arms, and no paired difference between them."""
    for seed, name in ((0, "a"), (1, "b")):
        fake_run(tmp_path / "runs" / name, "exp", 512, 0.1, seed=seed, doc_bins=True,
                 change={"data": {"name": "longcrawl64", "tag": "longcrawl64", "path": str(tmp_path / f"ds_{name}")}})
    report = main([str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--bootstrap", "50"]).read_text()
    labels = interval_labels(report)
    assert len(labels) == 2 and not any("seeds" in label for label in labels)
    assert [f"data.path={tmp_path / f'ds_{n}'}" in label for n, label in zip("ab", labels)] == [True, True]
    assert "not paired:" in report and f"data.path: {tmp_path / 'ds_a'} vs {tmp_path / 'ds_b'}" in report
    assert not paired_lines(report)
    assert "not paired:" in caplog.text


def test_recorded_data_identities_decide_arms_and_pairing(tmp_path):
    """Runs that recorded their data identity: other heldout tokens -> other arms, not paired; the same -> seeds."""
    for seed, name, digest in ((0, "a", "1" * 64), (1, "b", "2" * 64), (2, "c", "1" * 64)):
        run = fake_run(tmp_path / "runs" / name, "exp", 512, 0.1, seed=seed, doc_bins=True)
        (run / "data_identity.json").write_text(json.dumps(identity(digest)))
    report = main([str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--bootstrap", "50"]).read_text()
    labels = interval_labels(report)
    assert len(labels) == 2 and sum("(2 seeds)" in label for label in labels) == 1   # a and c are seeds
    assert "evaluated on different data" in report and "data.heldout_digest" in report
    assert not paired_lines(report)


def test_icl_markov_runs_of_other_document_lengths_are_not_paired(tmp_path):
    """data.doc_len: null generates max(1024, ctx)-token documents: ctx 1100 and ctx 64 saw other datasets, although
    their doc_index agree."""
    fake_run(tmp_path / "runs" / "long", "exp", 1100, 0.1, doc_bins=True)
    fake_run(tmp_path / "runs" / "short", "power", 64, 0.1, doc_bins=True)
    report = main([str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--bootstrap", "50"]).read_text()
    assert "evaluated on different data (data.doc_len: 1100 vs 1024" in report
    assert not paired_lines(report)


def test_a_sweep_over_data_pairs_within_each_data_set_and_names_each_two_sets_once(tmp_path, caplog):
    """Two attentions at each of three heldout sets: three paired differences (one per set), and one 'not paired' line
    for each two sets (three), not one for each two runs on other data (twelve)."""
    for i, digest in enumerate(("1" * 64, "2" * 64, "3" * 64)):
        for tag in ("exp", "power"):
            run = fake_run(tmp_path / "runs" / f"{tag}{i}", tag, 512, 0.1 + i / 10, doc_bins=True,
                           change={"data": {"doc_len": 1024 + i}})
            (run / "data_identity.json").write_text(json.dumps(identity(digest)))
    report = main([str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--bootstrap", "20"]).read_text()
    refused = [line for line in report.splitlines() if line.startswith("- not paired:")]
    assert len(refused) == 3 and all("2 groups (" in line and "data.heldout_digest" in line for line in refused)
    assert sum("not paired:" in r.message for r in caplog.records) == 3
    assert len(paired_lines(report)) == 3


def tiny_dataset(root, seed: int):
    """A prepared dataset in the LongCrawl64 layout: train.zarr and heldout.zarr of 8 documents of 64 tokens."""
    import zarr
    for split in ("train", "heldout"):
        arr = zarr.create_array(str(root / f"{split}.zarr"), shape=(8, 64), chunks=(4, 64), dtype="uint16",
                                attributes={"vocab_size": 100, "bos_id": 99})
        arr[:] = np.random.default_rng([seed, len(split)]).integers(0, 99, size=(8, 64))
    return root


def test_a_run_without_a_recorded_identity_is_known_by_its_dataset_on_disk(tmp_path):
    """An older run (no data_identity.json) whose dataset is on disk, under another path (a link), is a seed of the
    run that recorded that dataset's identity; a run on a dataset of other tokens is its own arm. An ICL Markov
    dataset missing from its cache is not generated by the report."""
    from longctx.data.identity import data_identity
    data = tiny_dataset(tmp_path / "ds", 0)
    (tmp_path / "ds_link").symlink_to(data)
    other = tiny_dataset(tmp_path / "ds_other", 1)
    for name, seed, path in (("new", 0, data), ("old", 1, tmp_path / "ds_link"), ("elsewhere", 2, other)):
        run = fake_run(tmp_path / "runs" / name, "exp", 64, 0.1, seed=seed, doc_bins=True,
                       change={"data": {"name": "longcrawl64", "tag": "longcrawl64", "path": str(path)}})
        if name == "new":
            (run / "data_identity.json").write_text(json.dumps(data_identity(data / "train.zarr",
                                                                             data / "heldout.zarr")))
    fake_run(tmp_path / "runs" / "icl", "power", 64, 0.1, change={"data": {"cache_dir": str(tmp_path / "cache")}})
    report = main([str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--bootstrap", "20"]).read_text()
    labels = interval_labels(report)
    assert sum("(2 seeds)" in label for label in labels) == 1 and len(labels) == 3
    assert "evaluated on different data" in report
    assert not (tmp_path / "cache").exists()


# ----- seeds are independent runs ---------------------------------------------------------------------------

def test_a_copied_run_is_refused_by_name(tmp_path, capsys):
    run = fake_run(tmp_path / "runs" / "a", "exp", 512, 0.1, doc_bins=True)
    shutil.copytree(run, tmp_path / "runs" / "a_copy")
    code, err = run_cli(capsys, tmp_path / "runs", "--out", tmp_path / "out")
    assert code == 2 and len(err) == 1
    assert str(run) in err[0] and str(tmp_path / "runs" / "a_copy") in err[0] and "seed=0" in err[0]
    assert not (tmp_path / "out").exists()


def test_a_copy_given_another_seed_is_refused_by_name(tmp_path, capsys):
    run = fake_run(tmp_path / "runs" / "a", "exp", 512, 0.1, doc_bins=True)
    copy = tmp_path / "runs" / "b"
    shutil.copytree(run, copy)
    cfg = OmegaConf.load(copy / "config.yaml")
    cfg.seed = 1
    OmegaConf.save(cfg, copy / "config.yaml")
    code, err = run_cli(capsys, tmp_path / "runs", "--out", tmp_path / "out")
    assert code == 2 and len(err) == 1
    assert str(run) in err[0] and str(copy) in err[0] and "identical evaluation records" in err[0]
    assert not (tmp_path / "out").exists()


def test_fine_tunes_of_other_checkpoints_with_one_file_name_are_two_arms(tmp_path):
    """Two sources whose checkpoints share a file name (checkpoints/latest.pt), one seed: two arms, told apart by
    their path."""
    for name in ("a", "b"):
        fake_run(tmp_path / "runs" / name, "exp", 512, 0.1, seed=0,
                 init_from=str(tmp_path / f"source_{name}" / "checkpoints" / "latest.pt"))
    report = main([str(tmp_path / "runs"), "--out", str(tmp_path / "out")]).read_text()
    labels = interval_labels(report)
    assert labels == ["exp, trainer.init_from=source_a/checkpoints/latest.pt",
                      "exp, trainer.init_from=source_b/checkpoints/latest.pt"]


# ----- damaged records --------------------------------------------------------------------------------------

def test_non_finite_per_document_losses_are_refused_naming_file_and_field(tmp_path, capsys):
    run = fake_run(tmp_path / "a", "exp", 512, 0.1, doc_bins=True)
    npz = run / "eval" / "step_00000020.npz"
    arrays = dict(np.load(npz))
    arrays["loss"][3] = np.nan
    np.savez(npz, **arrays)
    code, err = run_cli(capsys, run, "--out", tmp_path / "out", "--bootstrap", "50")
    assert code == 2 and len(err) == 1 and str(npz) in err[0] and "loss" in err[0] and "non-finite" in err[0]
    assert not (tmp_path / "out").exists()


def test_a_truncated_per_document_record_is_one_line(tmp_path, capsys):
    run = fake_run(tmp_path / "a", "exp", 512, 0.1, doc_bins=True)
    npz = run / "eval" / "step_00000020.npz"
    npz.write_bytes(npz.read_bytes()[:300])
    code, err = run_cli(capsys, run, "--out", tmp_path / "out", "--bootstrap", "50")
    assert code == 2 and len(err) == 1 and str(npz) in err[0] and "unreadable" in err[0]
    assert not (tmp_path / "out").exists()


def test_a_null_best_context_loss_is_one_line_naming_file_line_and_field(tmp_path, capsys):
    run = fake_run(tmp_path / "a", "exp", 512, 0.1)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    rec = json.loads(lines[-1])
    rec["best_context_loss"] = None
    (run / "metrics.jsonl").write_text("\n".join(lines[:-1] + [json.dumps(rec)]) + "\n")
    fake_run(tmp_path / "b", "power", 512, 0.1)
    code, err = run_cli(capsys, tmp_path / "a", tmp_path / "b", "--out", tmp_path / "out")
    assert code == 2 and len(err) == 1
    assert f"{run / 'metrics.jsonl'}:2: best_context_loss is null" in err[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, says", [(["--at-flops", "nan"], "--at-flops nan"),
                                        (["--at-flops", "-1"], "--at-flops -1.0"),
                                        (["--at-flops", "inf"], "--at-flops inf"),
                                        (["--bootstrap", "100000000"], "--bootstrap 100000000")])
def test_numbers_out_of_range_are_one_line_before_any_work(tmp_path, capsys, argv, says):
    run = fake_run(tmp_path / "a", "exp", 512, 0.1, doc_bins=True)
    code, err = run_cli(capsys, run, "--out", tmp_path / "out", *argv)
    assert code == 2 and len(err) == 1 and says in err[0]
    assert not (tmp_path / "out").exists()


def test_too_many_resamples_for_the_documents_is_refused():
    from longctx.report.stats import MAX_RESAMPLED_DOCS, resample_weights
    with pytest.raises(ValueError, match="--bootstrap 100000: .* GiB"):
        resample_weights(MAX_RESAMPLED_DOCS // 100_000 + 1, 100_000)


# ----- outputs never land on other files --------------------------------------------------------------------

def other_runs(tmp_path):
    """The run reported, a finished run left out of the report, and one just started (config.yaml and its lock)."""
    run = fake_run(tmp_path / "run", "exp", 512, 0.1, doc_bins=True)
    other = fake_run(tmp_path / "other", "power", 512, 0.1, doc_bins=True)
    (other / "icl_curves.png").write_bytes(b"the run's own figure")
    started = tmp_path / "started"
    started.mkdir()
    shutil.copy(run / "config.yaml", started / "config.yaml")
    (started / ".lock").write_text("pid 1")
    return run, other, started


@pytest.mark.parametrize("case", ["record_in_other_eval", "record_on_intervals", "out_other_run", "out_started",
                                  "out_below_other_run"])
def test_outputs_never_overwrite_another_run_or_the_reports_own_files(tmp_path, capsys, case):
    run, other, started = other_runs(tmp_path)
    out = tmp_path / "out"
    args = {"record_in_other_eval": ["--out", out, "--record", other / "eval" / "step_00000020.json"],
            "record_on_intervals": ["--out", out, "--record", out / "intervals.json"],
            "out_other_run": ["--out", other],
            "out_started": ["--out", started],
            "out_below_other_run": ["--out", other / "eval"]}[case]
    if case == "record_on_intervals":
        out.mkdir()
    before = files_under(tmp_path)
    code, err = run_cli(capsys, run, *args)
    assert code == 2 and len(err) == 1
    assert ("another of the report's outputs" if case == "record_on_intervals" else "is a folder of the run") in err[0]
    assert files_under(tmp_path) == before


def deny_writes(monkeypatch, folder):
    """os.access as for a read-only `folder` (root, as tests may run, writes anywhere: chmod would not show it)."""
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if (mode & os.W_OK) and str(p).startswith(
        str(folder)) else real(p, mode, **kw))


def test_a_read_only_record_folder_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch):
    run = fake_run(tmp_path / "a", "exp", 512, 0.1, doc_bins=True)
    locked = tmp_path / "locked"
    locked.mkdir()
    deny_writes(monkeypatch, locked)
    code, err = run_cli(capsys, run, "--out", tmp_path / "out", "--record", locked / "r.json", "--bootstrap", "50")
    assert code == 2 and len(err) == 1 and str(locked) in err[0] and "not writable" in err[0]
    assert not (tmp_path / "out").exists() and not list(locked.iterdir())


# ----- scripts/plot_results.py ------------------------------------------------------------------------------

@pytest.fixture
def compact_dir(tmp_path):
    """A folder holding a compact report record (JSON + per-document npz), as `longctx.report --record` writes."""
    fake_run(tmp_path / "runs" / "exp", "exp", 512, 0.1, doc_bins=True)
    fake_run(tmp_path / "runs" / "power", "power", 512, 0.05, doc_bins=True)
    docs = tmp_path / "docs"
    docs.mkdir()
    main([str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--record", str(docs / "cmp.json"),
          "--bootstrap", "20", "--record-figures", "icl_curves"])
    return docs


def plot_cli(plot_results, capsys, *args):
    with pytest.raises(SystemExit) as exit_:
        plot_results.main([str(a) for a in args])
    return exit_.value.code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("damage", ["cut_json", "cut_npz", "nan_npz"])
def test_plot_results_refuses_a_damaged_compact_record_naming_the_file(compact_dir, import_script, capsys,
                                                                       damage):
    plot_results = import_script("plot_results")
    target = compact_dir / ("cmp.json" if damage == "cut_json" else "cmp.npz")
    if damage == "nan_npz":
        arrays = dict(np.load(target))
        arrays["r1_loss"][0, 0] = np.inf
        np.savez_compressed(target, **arrays)
    else:
        target.write_bytes(target.read_bytes()[:len(target.read_bytes()) // 2])
    before = files_under(compact_dir)
    code, err = plot_cli(plot_results, capsys, "--dir", compact_dir)
    assert code == 2 and len(err) == 1 and str(target) in err[0]
    assert files_under(compact_dir) == before


def test_plot_results_names_a_cut_results_table(tmp_path, import_script, capsys):
    plot_results = import_script("plot_results")
    (tmp_path / "wsfr.json").write_text('{"model": "gpt2", "rows": [')
    code, err = plot_cli(plot_results, capsys, "--dir", tmp_path)
    assert code == 2 and len(err) == 1 and str(tmp_path / "wsfr.json") in err[0] and "not valid JSON" in err[0]


def test_plot_results_draws_only_inside_dir(compact_dir, import_script, capsys):
    plot_results = import_script("plot_results")
    record = json.loads((compact_dir / "cmp.json").read_text())
    record["figures"] = {"icl_curves": "../outside.png"}
    (compact_dir / "cmp.json").write_text(json.dumps(record))
    code, err = plot_cli(plot_results, capsys, "--dir", compact_dir)
    assert code == 2 and len(err) == 1 and "'../outside.png'" in err[0]
    assert not (compact_dir.parent / "outside.png").exists()


def test_plot_results_refuses_a_read_only_dir_before_drawing(compact_dir, import_script, capsys, monkeypatch):
    plot_results = import_script("plot_results")
    before = files_under(compact_dir)
    deny_writes(monkeypatch, compact_dir)
    code, err = plot_cli(plot_results, capsys, "--dir", compact_dir)
    assert code == 2 and len(err) == 1 and str(compact_dir) in err[0]
    assert files_under(compact_dir) == before
