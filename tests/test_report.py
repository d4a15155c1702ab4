"""python -m longctx.report: the table equals the runs' own metrics.jsonl; labels name every config key that differs;
seeds aggregate with intervals; a run still writing or starting never blocks the others; bad input fails with one
line and exit 2, before any work."""
from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf
from report_fixtures import fake_run

from longctx.report import find_runs, gap_curve, label_runs, load_run, main
from longctx.report.cli import write_report
from longctx.report.runs import describe_comparison, group_runs
from longctx.report.stats import bootstrap, load_doc_bins, paired_difference


def table(text: str, first_header: str) -> dict[str, list[str]]:
    """The Markdown table whose header starts with `first_header`, rows keyed by their first cell."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.split("|")[1:-1]]
        rows[cells[0]] = cells
    return rows


def test_report_table_equals_the_runs_metrics(tmp_path):
    sweep = tmp_path / "sweep"
    runs = [fake_run(sweep / "0_exp", "exp", 1024, 0.1), fake_run(sweep / "1_power", "power", 1024, 0.05),
            fake_run(sweep / "2_window", "window", 2048, 0.2, npy=True)]
    extra = fake_run(tmp_path / "single", "linear", 2048, 0.3)
    report = main([str(sweep), str(extra), "--out", str(tmp_path / "out"), "--title", "test"])
    text = report.read_text()
    rows = table(text, "run")
    assert set(rows) == {"0_exp", "1_power", "2_window", "single"}
    for run in runs + [extra]:
        final = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
        row = rows[run.name]
        assert row[5] == f"{final['best_context_loss']:.3f}"
        assert row[6] == str(final["best_context_position"])
        assert row[7] == f"{final['last10_loss']:.3f}"
        assert row[8] == f"{final['best_context_gap']:+.3f}"
        assert row[9] == f"{final['max_bin_gap']:+.3f}"
        assert row[10] == f"{final['state_size']:,}"
        assert row[11] == "1:4"
        assert row[12] == f"{final['tokens_per_s']:,.0f}"
        assert row[13] == "complete"
    for png in ("icl_curves.png", "gap_to_optimum.png", "best_context_vs_flops.png", "best_context_vs_context.png",
                "icl_over_training.png"):
        assert (tmp_path / "out" / png).stat().st_size > 10_000
        assert f"]({png})" in text


def test_gap_curve_is_the_binned_loss_minus_the_optimum(tmp_path):
    run = load_run(fake_run(tmp_path / "r", "exp", 512, 0.1))
    gaps = gap_curve(run.final)
    assert [(a, b) for a, b, _ in gaps] == [(a, b) for a, b, _ in run.final["icl_curve"]]
    np.testing.assert_allclose([g for *_, g in gaps], 0.1 + 0.5 / 2, atol=1e-9)
    assert max(g for *_, g in gaps) == pytest.approx(run.final["max_bin_gap"])
    assert gap_curve({"icl_curve": run.final["icl_curve"]}) == []   # no known optimum: no gap


def test_equal_flop_overlay_and_sweep_discovery(tmp_path):
    fake_run(tmp_path / "a", "exp", 512, 0.1, steps=(10, 20, 30))
    fake_run(tmp_path / "b", "power", 512, 0.1, steps=(10, 20, 30))
    assert [p.name for p in find_runs([tmp_path])] == ["a", "b"]
    # exp spends 2e12 FLOPs a step: within 3e13 FLOPs it reached step 10 only, power step 30
    assert load_run(tmp_path / "a").at_flops(3e13)["step"] == 10
    assert load_run(tmp_path / "b").at_flops(3e13)["step"] == 30
    main([str(tmp_path), "--out", str(tmp_path / "out"), "--at-flops", "3e13"])
    assert (tmp_path / "out" / "icl_curves.png").exists()
    text = (tmp_path / "out" / "report.md").read_text()   # the figure says which evaluations it shows, the tables not
    assert "Each run at its last evaluation within 3e+13 training FLOPs (--at-flops); the tables above are every " \
           "run's final evaluation." in text.split("## ICL curves")[1]
    # a record keeps final evaluations, from which its figures would be redrawn otherwise: refused, nothing written
    with pytest.raises(ValueError, match=r"^--at-flops with --record: a record keeps each run's final evaluation"):
        write_report([tmp_path / "a", tmp_path / "b"], tmp_path / "out2", at_flops=3e13,
                     record=tmp_path / "rec" / "r.json")
    assert not (tmp_path / "out2").exists() and not (tmp_path / "rec").exists()


def _labels(tmp_path, variants: dict, attention="exp") -> list:
    runs = [load_run(fake_run(tmp_path / name, attention, 512, 0.1, **kw)) for name, kw in variants.items()]
    label_runs(runs)
    return runs


def test_labels_name_every_config_key_that_differs(tmp_path):
    runs = _labels(tmp_path, {"scratch": {}, "warm": {"init_from": str(tmp_path / "short_run")}})
    assert [r.label for r in runs] == ["exp, trainer.init_from=null", "exp, trainer.init_from=short_run"]
    runs = _labels(tmp_path / "v", {
        "plain": {}, "sink": {"change": {"attention": {"sink": True}}},
        "rope16": {"change": {"arch": {"rope_dims": 16}}}, "shift": {"change": {"arch": {"token_shift": True}}}})
    # no sink, rope_dims or token_shift key in these configs: the defaults of conf/ and of the attention core
    assert [r.label for r in runs] == [
        "exp, arch.rope_dims=null, arch.token_shift=false, sink=false",
        "exp, arch.rope_dims=null, arch.token_shift=false, sink=true",
        "exp, arch.rope_dims=16, arch.token_shift=false, sink=false",
        "exp, arch.rope_dims=null, arch.token_shift=true, sink=false"]
    # output names never label a run (every run's run_dir and run_name differ); an attention's parameter labels
    # only runs of that attention; a run's seed labels it but not its group of seeds
    mixed = [load_run(fake_run(tmp_path / "m" / name, att, 512, 0.1, seed=seed, change=change))
             for name, att, seed, change in [("p0", "power", 0, {}), ("p1", "power", 1, {}),
                                             ("n0", "power", 0, {"attention": {"output_norm": True}}),
                                             ("e0", "exp", 0, {})]]
    assert label_runs(mixed) == ["attention.output_norm", "seed"]
    assert [r.label for r in mixed] == ["power_p2, output_norm=false, seed=0", "power_p2, output_norm=false, seed=1",
                                        "power_p2, output_norm=true, seed=0", "exp, seed=0"]
    assert [g.label for g in group_runs(mixed)] == ["power_p2, output_norm=false (2 seeds)",
                                                    "power_p2, output_norm=true", "exp"]


def test_the_evaluation_cadence_labels_runs_only_where_it_is_all_that_differs(tmp_path):
    """trainer.eval_every (how often a run evaluated and checkpointed) tells nothing about what trained: beside another
    difference it stays out of the labels and the keys compared; between runs it alone tells apart it stays in."""
    def runs(folder, specs):
        return [load_run(fake_run(tmp_path / folder / name, att, 512, 0.1, seed=seed,
                                  change={"trainer": {"eval_every": every}})) for name, att, seed, every in specs]

    mixed = runs("mixed", [("e", "exp", 0, 100), ("p", "power", 0, 250)])
    assert label_runs(mixed) == [] and [r.label for r in mixed] == ["exp", "power_p2"]
    seeds = runs("seeds", [("s0", "exp", 0, 100), ("s1", "exp", 1, 100), ("l0", "linear", 0, 50)])
    assert label_runs(seeds) == ["seed"]
    assert [g.label for g in group_runs(seeds)] == ["exp (2 seeds)", "linear"]
    only = runs("only", [("a", "exp", 0, 100), ("b", "exp", 0, 200)])
    assert label_runs(only) == ["trainer.eval_every"]
    assert [r.label for r in only] == ["exp, trainer.eval_every=100", "exp, trainer.eval_every=200"]
    # the other seed of another cadence: without it both would be one label over two groups
    apart = runs("apart", [("a", "exp", 0, 100), ("b", "exp", 1, 200)])
    assert label_runs(apart) == ["seed", "trainer.eval_every"]
    assert [g.label for g in group_runs(apart)] == ["exp, trainer.eval_every=100", "exp, trainer.eval_every=200"]


def test_runs_on_other_data_get_their_own_label_and_optimum(tmp_path):
    from longctx.report.figures import draw_icl_overlay, optima
    runs = [load_run(fake_run(tmp_path / f"v{v}", "exp", 512, 0.1, change={"data": {"vocab": v}})) for v in (4, 8)]
    keys = label_runs(runs)
    assert keys == ["data.vocab"]
    assert [r.label for r in runs] == ["exp, data.vocab=4", "exp, data.vocab=8"]
    labels = [label for label, _ in optima(runs, None)]
    assert labels == ["Bayes-optimal (data.vocab=4)", "Bayes-optimal (data.vocab=8)"]
    fig = draw_icl_overlay(group_runs(runs), runs, "t")
    drawn = {line.get_label(): line.get_ydata() for line in fig.axes[0].get_lines()}
    for run, label in zip(runs, labels):                 # each optimum is its own data's
        np.testing.assert_allclose(drawn[label], [v for *_, v in run.final["bayes_curve"]])


def test_an_old_config_lacking_newer_keys_takes_their_defaults(tmp_path):
    old = fake_run(tmp_path / "old", "exp", 512, 0.1, drop=("data.docs_per_batch", "data.reshape_block"))
    new = fake_run(tmp_path / "new", "power", 512, 0.1)
    runs = [load_run(old), load_run(new)]
    assert runs[0].flat["data.docs_per_batch"] == 32      # conf/data/icl_markov.yaml's default
    assert label_runs(runs) == []                         # no spurious difference: only the attention's tag
    assert [r.label for r in runs] == ["exp", "power_p2"]
    assert main([str(tmp_path), "--out", str(tmp_path / "out")]).exists()


def test_runs_sharing_a_folder_name_are_told_apart_by_their_parents(tmp_path):
    fake_run(tmp_path / "exp" / "stage2", "exp", 512, 0.1)
    fake_run(tmp_path / "power" / "stage2", "power", 512, 0.1)
    fake_run(tmp_path / "solo", "linear", 512, 0.1)
    rows = table(main([str(tmp_path), "--out", str(tmp_path / "out")]).read_text(), "run")
    assert sorted(rows) == ["exp/stage2", "power/stage2", "solo"]


def test_a_cut_line_an_unfinished_and_an_empty_run_do_not_block_the_others(tmp_path, caplog):
    sweep = tmp_path / "sweep"
    cut = fake_run(sweep / "0_cut", "exp", 512, 0.1, steps=(10, 20, 30))
    text = (cut / "metrics.jsonl").read_text()
    (cut / "metrics.jsonl").write_text(text[:len(text) - 40])    # the last record cut mid-line
    fake_run(sweep / "1_running", "power", 512, 0.1, steps=(10,), max_steps=100)
    (sweep / "2_starting").mkdir()
    (sweep / "2_starting" / "metrics.jsonl").write_text("")
    OmegaConf.save(OmegaConf.load(cut / "config.yaml"), sweep / "2_starting" / "config.yaml")
    with caplog.at_level(logging.WARNING, logger="longctx.report"):
        report = main([str(sweep), "--out", str(tmp_path / "out")]).read_text()
    assert f"{cut / 'metrics.jsonl'}:3: incomplete line skipped" in caplog.text
    rows = table(report, "run")
    assert rows["0_cut"][3] == "20"                              # the complete records are used
    assert rows["0_cut"][13] == "unfinished: step 20 of trainer.max_steps=30"
    assert rows["1_running"][13] == "unfinished: step 10 of trainer.max_steps=100"
    assert "2_starting" not in rows and f"{sweep / '2_starting'}: no evaluation yet" in report


def test_a_run_resumed_with_a_shorter_length_is_judged_by_its_newest_launch(tmp_path):
    """A run launched for 100 steps, stopped, and resumed at step 10 with trainer.max_steps=20 (the trainer writes
    that launch's config.resume_step10.yaml) ended where its newest launch said: complete, not 'unfinished'."""
    run = fake_run(tmp_path / "sweep" / "resumed", "exp", 512, 0.1, steps=(10, 20), max_steps=100)
    assert load_run(run).status == "unfinished: step 20 of trainer.max_steps=100"
    import os
    cfg = OmegaConf.load(run / "config.yaml")
    cfg.trainer.max_steps = 20
    OmegaConf.save(cfg, run / "config.resume_step10.yaml")
    os.utime(run / "config.resume_step10.yaml", ns=(2 * 10**18, 2 * 10**18))  # written after config.yaml
    assert load_run(run).status == "complete"
    cfg.trainer.max_steps = 50  # a later launch from the same step, with another config: .launch2 is the newest
    OmegaConf.save(cfg, run / "config.resume_step10.launch2.yaml")
    os.utime(run / "config.resume_step10.launch2.yaml", ns=(3 * 10**18, 3 * 10**18))
    assert load_run(run).status == "unfinished: step 20 of trainer.max_steps=50"
    # a third launch repeating the first resume's config writes no file but touches it: it is the newest again
    os.utime(run / "config.resume_step10.yaml", ns=(4 * 10**18, 4 * 10**18))
    assert load_run(run).status == "complete"


def test_a_resume_that_changed_the_learning_rate_is_no_seed_of_runs_that_kept_it(tmp_path):
    """Three seeds of lr 3e-3; seed 2 resumed at step 10 with optim.lr=1e-3 (its config.resume_step10.yaml): it trained
    under another schedule, so it is labelled by the change and grouped apart; seed 1 resumed with its own config (a
    requeue: trainer.resume, logging and evaluation cadence aside) stays a seed of the group."""
    runs = [fake_run(tmp_path / f"s{seed}", "exp", 512, 0.1, seed=seed, change={"optim": {"lr": 3e-3}})
            for seed in (0, 1, 2)]
    for run, lr in ((runs[1], 3e-3), (runs[2], 1e-3)):
        cfg = OmegaConf.load(run / "config.yaml")
        cfg.optim.lr = lr
        # what every relaunch changes without changing what trains: never a label
        cfg.trainer.resume, cfg.trainer.eval_every, cfg.logger = True, 7, {"wandb": {"mode": "offline"}}
        OmegaConf.save(cfg, run / "config.resume_step10.yaml")
    loaded = [load_run(run) for run in runs]
    label_runs(loaded)
    assert [r.label for r in loaded] == ["exp, seed=0, resumed=none", "exp, seed=1, resumed=none",
                                         "exp, seed=2, resumed=at step 10: optim.lr 0.003 -> 0.001"]
    assert [g.label for g in group_runs(loaded)] == ["exp, resumed=none (2 seeds)",
                                                     "exp, resumed=at step 10: optim.lr 0.003 -> 0.001"]


def test_out_replaces_an_earlier_report_whole_and_never_an_edited_file(tmp_path, capsys):
    """A second report into the same --out replaces the first's files, its figures no longer drawn removed (none left
    beside a report.md that does not show them); a report.md edited since, or a file of a report's name that no
    report wrote, is refused before anything is written."""
    a = fake_run(tmp_path / "sweep" / "a", "exp", 512, 0.1)
    b = fake_run(tmp_path / "sweep" / "b", "exp", 1024, 0.1)
    out = tmp_path / "out"
    main([str(a), str(b), "--out", str(out), "--bootstrap", "10"])
    assert (out / "best_context_vs_context.png").exists()  # two contexts
    assert "earlier report" not in capsys.readouterr().err
    main([str(a), "--out", str(out), "--bootstrap", "10"])
    assert not (out / "best_context_vs_context.png").exists() and "vs context figure" in (out / "report.md").read_text()
    assert (f"note: --out {out} held an earlier report: replaced (best_context_vs_context.png removed: not drawn this "
            f"time)") in capsys.readouterr().err
    (out / "report.md").write_text("my notes\n")
    with pytest.raises(SystemExit):
        main([str(a), "--out", str(out), "--bootstrap", "10"])
    assert "report.md is not the file an earlier report wrote there" in capsys.readouterr().err
    assert (out / "report.md").read_text() == "my notes\n"
    other = tmp_path / "other"
    other.mkdir()
    (other / "icl_curves.png").write_bytes(b"mine")
    with pytest.raises(SystemExit):
        main([str(a), "--out", str(other), "--bootstrap", "10"])
    assert (other / "icl_curves.png").read_bytes() == b"mine" and not (other / "report.md").exists()


def test_record_never_overwrites_a_file_that_is_not_a_report_record(tmp_path, capsys):
    """--record onto an unrelated JSON (or beside an unrelated .npz) is refused, the file untouched; onto an earlier
    report's record it is replaced, as the documented carry steps do."""
    run = fake_run(tmp_path / "sweep" / "a", "exp", 512, 0.1, doc_bins=True)
    mine = tmp_path / "mine.json"
    mine.write_text('{"mine": 1}')
    with pytest.raises(SystemExit) as exit_info:
        main([str(run), "--out", str(tmp_path / "out"), "--record", str(mine), "--bootstrap", "10"])
    assert exit_info.value.code == 2 and mine.read_text() == '{"mine": 1}'
    assert "exists and is not a report's record" in capsys.readouterr().err
    (tmp_path / "orphan.npz").write_bytes(b"data")
    with pytest.raises(SystemExit):
        main([str(run), "--out", str(tmp_path / "out"), "--record", str(tmp_path / "orphan.json"), "--bootstrap", "10"])
    assert (tmp_path / "orphan.npz").read_bytes() == b"data" and not (tmp_path / "orphan.json").exists()
    ok = tmp_path / "rec.json"
    main([str(run), "--out", str(tmp_path / "out1"), "--record", str(ok), "--bootstrap", "10"])
    main([str(run), "--out", str(tmp_path / "out2"), "--record", str(ok), "--bootstrap", "10"])  # a record: replaced
    assert json.loads(ok.read_text())["kind"] == "report"


def test_record_goes_into_a_folder_not_made_yet(tmp_path):
    """--record inside the --out the report makes, or in a folder of its own not made yet: both folders are made, as
    --out's, and the record is a report's; a file where its folder would be is refused before anything is written."""
    run = fake_run(tmp_path / "sweep" / "a", "exp", 512, 0.1, doc_bins=True)
    for out, rec in ((tmp_path / "new", tmp_path / "new" / "record.json"),
                     (tmp_path / "out", tmp_path / "records" / "deep" / "record.json")):
        main([str(run), "--out", str(out), "--record", str(rec), "--bootstrap", "10"])
        assert (out / "report.md").read_text().count("\n1 run: `a`") == 1     # one run, said so
        assert json.loads(rec.read_text())["kind"] == "report"
        assert rec.with_suffix(".npz").is_file()
    (tmp_path / "afile").write_text("x")       # a file where the record's folder would be: refused before any write
    (tmp_path / "afile").chmod(0o755)
    with pytest.raises(SystemExit) as exit_info:
        main([str(run), "--out", str(tmp_path / "out3"), "--record", str(tmp_path / "afile" / "r.json"),
              "--bootstrap", "10"])
    assert exit_info.value.code == 2 and not (tmp_path / "out3").exists()
    assert (tmp_path / "afile").read_text() == "x"


def test_record_replaces_the_pair_a_cut_short_write_left_and_nothing_else(tmp_path, capsys, monkeypatch):
    """A --record write cut short between its two files (the .npz written, its JSON not) leaves files --out's
    .report_files.json lists: the same command again replaces them with the whole pair, equal to one written in one
    go. The same .npz edited since is refused, untouched."""
    from longctx.report import manifest

    run = fake_run(tmp_path / "sweep" / "a", "exp", 512, 0.1, doc_bins=True)
    clean = tmp_path / "clean.json"
    main([str(run), "--out", str(tmp_path / "out0"), "--record", str(clean), "--bootstrap", "10"])
    rec = tmp_path / "rec.json"
    args = [str(run), "--out", str(tmp_path / "out"), "--record", str(rec), "--bootstrap", "10"]

    def same_as_clean():
        with np.load(rec.with_suffix(".npz")) as mine, np.load(clean.with_suffix(".npz")) as theirs:
            assert sorted(mine.files) == sorted(theirs.files) and mine.files
            assert all(np.array_equal(mine[k], theirs[k]) for k in mine.files)
        assert rec.read_text() == clean.read_text().replace("clean.npz#", "rec.npz#").replace('"clean_', '"rec_')

    main(args)
    rec.unlink()  # as a write stopped between the two files leaves them
    main(args)
    same_as_clean()
    real = manifest.write_atomic

    def cut_short(path, data):
        if Path(path) == rec:
            raise KeyboardInterrupt
        return real(path, data)

    monkeypatch.setattr(manifest, "write_atomic", cut_short)
    rec.unlink()
    rec.with_suffix(".npz").unlink()
    with pytest.raises(KeyboardInterrupt):
        main(args)
    monkeypatch.undo()
    assert rec.with_suffix(".npz").exists() and not rec.exists()
    main(args)
    same_as_clean()
    rec.unlink()
    rec.with_suffix(".npz").write_bytes(b"edited")
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2 and rec.with_suffix(".npz").read_bytes() == b"edited" and not rec.exists()
    assert f"{rec.with_suffix('.npz')} exists and is not a report's record" in capsys.readouterr().err


def test_seeds_aggregate_with_intervals_and_paired_differences(tmp_path):
    sweep = tmp_path / "sweep"
    for seed in range(3):
        fake_run(sweep / f"exp_s{seed}", "exp", 512, 0.10, seed=seed, doc_bins=True)
    fake_run(sweep / "power_s0", "power", 512, 0.05, seed=0, doc_bins=True)
    report = main([str(sweep), "--out", str(tmp_path / "out"), "--bootstrap", "500"]).read_text()
    rows = table(report, "runs")
    exp = rows["exp (3 seeds)"]
    finals = [load_run(sweep / f"exp_s{s}").final for s in range(3)]
    mean, low, high = map(float, re.match(r"([\d.]+) \[([\d.]+), ([\d.]+)\]", exp[4]).groups())
    assert mean == pytest.approx(np.mean([f["best_context_loss"] for f in finals]), abs=6e-4)
    assert low < mean < high
    sd = np.std([f["best_context_loss"] for f in finals], ddof=1)
    assert exp[1] == "3" and exp[8].startswith(f"{sd:.3f};")
    # the interval is the documents': as wide as the bootstrap of one seed's record (the seeds share documents)
    one = bootstrap(load_doc_bins(sweep / "exp_s0" / finals[0]["doc_bins"]), "best_context_loss", 500)
    assert high - low == pytest.approx(one.high - one.low, rel=0.05)
    # exp minus power: 0.05 nats by construction (+0.001, the seeds' mean offset); paired, the interval is tight
    diff_line = next(line for line in report.splitlines() if line.startswith("| exp (3 seeds) | power_p2 |"))
    est, lo, hi = map(float, re.search(r"\| ([+-][\d.]+) \[([+-][\d.]+), ([+-][\d.]+)\]", diff_line).groups())
    assert est == pytest.approx(0.05 + 0.001, abs=2e-4) and lo < est < hi and hi - lo < 0.02


def test_paired_difference_refuses_runs_on_other_documents(tmp_path):
    a = fake_run(tmp_path / "a", "exp", 512, 0.1, doc_bins=True)
    b = fake_run(tmp_path / "b", "power", 512, 0.1, doc_bins=True, doc_index=np.arange(1, 65))
    report = main([str(tmp_path), "--out", str(tmp_path / "out"), "--bootstrap", "50"]).read_text()
    assert "not paired: exp and power_p2: evaluated on different heldout documents" in report
    ra, rb = load_run(a), load_run(b)
    with pytest.raises(ValueError, match="a and b: evaluated on different heldout documents"):
        paired_difference(ra.doc_bins(ra.final), rb.doc_bins(rb.final), "curve", "a", "b")


def test_provenance_fields_that_differ_are_printed(tmp_path, capsys):
    for name, commit in (("a", "abc123"), ("b", "def456")):
        run = fake_run(tmp_path / name, "exp" if name == "a" else "power", 512, 0.1)
        (run / "provenance.json").write_text(json.dumps({
            "command": ["train.py"], "git": {"commit": commit, "dirty": False}, "versions": {"torch": "2.11"},
            "time": f"2026-01-0{len(name)}"}))
    fake_run(tmp_path / "c", "linear", 512, 0.1)                 # older run: no provenance.json
    report = main([str(tmp_path), "--out", str(tmp_path / "out")]).read_text()
    out = capsys.readouterr().out
    assert "provenance git.commit differs: a: abc123; b: def456; c: (none)" in out
    assert "`git.commit`" in report and "versions.torch" in out and "time" not in out


def test_title_says_what_is_compared(tmp_path):
    sweep = tmp_path / "2026-12-01_10-00-00"
    runs = [load_run(fake_run(sweep / "0", "exp", 512, 0.1)), load_run(fake_run(sweep / "1", "power", 1024, 0.1))]
    title = describe_comparison(runs, label_runs(runs))
    assert title == "attention, ctx compared (gpt2, d256l4, icl_markov)"
    text = main([str(sweep), "--out", str(tmp_path / "out")]).read_text()
    assert text.startswith(f"# {title}\n") and "2026-12-01" not in text.splitlines()[0]


def run_cli(capsys, *args):
    """main() in this process (a subprocess per case would import torch each time): (exit code, stderr)."""
    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in args])
    return exit_.value.code, capsys.readouterr().err


def test_bad_input_is_one_line_and_exit_2_before_any_work(tmp_path, capsys):
    out = subprocess.run([sys.executable, "-m", "longctx.report", str(tmp_path / "missing"), "--out",
                          str(tmp_path / "o")], capture_output=True, text=True)
    assert out.returncode == 2 and "missing" in out.stderr and "Traceback" not in out.stderr
    (tmp_path / "empty").mkdir()
    code, err = run_cli(capsys, tmp_path / "empty", "--out", tmp_path / "o")
    assert code == 2 and "no metrics.jsonl" in err
    run = fake_run(tmp_path / "run", "exp", 512, 0.1)
    target = tmp_path / "report.md"
    target.write_text("keep")
    code, err = run_cli(capsys, run, "--out", target)
    assert code == 2 and err.strip().count("\n") == 0
    assert f"--out {target}: is a file" in err and target.read_text() == "keep"
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        code, err = run_cli(capsys, run, "--out", locked / "r")
        assert code == 2 and "not writable" in err and not (locked / "r").exists()
    code, err = run_cli(capsys, run, "--out", tmp_path / "o", "--bootstrap", "0")
    assert code == 2 and "--bootstrap 0" in err and not (tmp_path / "o").exists()


def test_old_records_and_broken_folders_are_reported_or_left_out_with_a_line(tmp_path, caplog):
    """A record from before last10_loss/flops existed shows '-'; a line that is JSON but no evaluation, and a
    config.yaml that is not YAML, are named, and the other runs are still reported."""
    old = fake_run(tmp_path / "old", "exp", 512, 0.1)
    lines = (old / "metrics.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    for rec in recs:
        for key in ("last10_loss", "flops", "best_context_position"):
            rec.pop(key)
    (old / "metrics.jsonl").write_text("\n".join([json.dumps(r) for r in recs] + ['{"note": "hello"}']) + "\n")
    bad = fake_run(tmp_path / "bad", "power", 512, 0.1)
    (bad / "config.yaml").write_text("ctx: [unclosed\n")
    early = tmp_path / "early"   # stopped before its first evaluation: a run folder without metrics.jsonl
    (early / "checkpoints").mkdir(parents=True)
    (early / "train.log").write_text("stopped by SIGTERM after step 97\n")
    (early / "config.yaml").write_text("ctx: 512\n")
    with caplog.at_level(logging.WARNING, logger="longctx.report"):
        report = main([str(tmp_path), "--out", str(tmp_path / "out")]).read_text()
    assert f"{early}: no evaluation yet (no metrics.jsonl: it stopped, or is running, before its first " \
           f"trainer.eval_every)" in report
    assert f"{old / 'metrics.jsonl'}:3: not an evaluation record (no 'step'); skipped" in caplog.text
    assert f"{bad / 'config.yaml'}: unreadable" in report
    row = table(report, "run")["old"]
    assert row[3] == "20" and row[4] == "-" and row[7] == "-"
    assert row[6] == str(recs[-1]["best_context_bin"][1])     # the older record's best bin gives its position


def test_a_staged_run_is_reported_by_its_last_stage(tmp_path):
    """A sweep point trained in stages (trainer.stages) holds a run per stage; its result is the last stage's."""
    for stage in ("stage1_ctx256", "stage2_ctx512"):
        fake_run(tmp_path / "point" / stage, "power", 512, 0.1, steps=(10,))
    (tmp_path / "point" / "stages.json").write_text(json.dumps(
        {"stages": [{"dir": "stage1_ctx256", "overrides": {"ctx": 256}}, {"dir": "stage2_ctx512", "overrides": {}}]}))
    fake_run(tmp_path / "plain", "exp", 512, 0.1, steps=(10,))
    assert [p.name for p in find_runs([tmp_path])] == ["plain", "stage2_ctx512"]
    assert [p.name for p in find_runs([tmp_path / "point" / "stage1_ctx256"])] == ["stage1_ctx256"]  # named: kept


@pytest.mark.parametrize("flag, where", [("--out", ""), ("--out", "eval"), ("--record", "eval/step_00000020.json")])
def test_report_refuses_to_write_into_a_runs_own_folders(tmp_path, capsys, flag, where):
    """The report's icl_curves.png and a record's NAME.npz would land on the run's own files: refused, nothing
    written, the run's files unchanged."""
    run = fake_run(tmp_path / "run", "exp", 512, 0.1, doc_bins=True)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    args = [str(run), "--out", str(run / where) if flag == "--out" else str(tmp_path / "rep")]
    if flag == "--record":
        args += ["--record", str(run / where)]
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{flag} " in err[0] and "is a folder of the run" in err[0]
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "rep").exists()


def retrieval_result(run, task: str, step: int, choice: float) -> dict:
    """A result as `python -m longctx.evaluate RUN --task TASK` writes it: 2 contexts x 2 depths x 10 trials x 5
    digits = 200 key symbols."""
    rec = {"task": task, "step": step, "contexts": [256, 512], "depths": [0.0, 1.0], "trials": 10, "digits": 5,
           "base": 10, "chance": {"digit": 0.1, "key": 1e-5, "choice": 0.1},
           "key_accuracy": [[0.0, 0.0], [0.0, 0.0]], "digit_accuracy": [[0.0, 0.0], [0.0, 0.0]],
           "choice_accuracy": [[choice] * 2] * 2, "mean_key_accuracy": 0.0, "mean_digit_accuracy": 0.0,
           "mean_choice_accuracy": choice}
    (run / "eval").mkdir(exist_ok=True)
    (run / "eval" / f"{task}-step{step}.json").write_text(json.dumps(rec))
    return rec


def test_retrieval_results_join_the_report_and_the_record_with_wilson_intervals(tmp_path):
    from longctx.report.retrieval import wilson_interval

    sweep = tmp_path / "sweep"
    exp = fake_run(sweep / "exp", "exp", 512, 0.1)
    fake_run(sweep / "power", "power", 512, 0.05)
    retrieval_result(exp, "passkey", 10, 0.5)
    newest = retrieval_result(exp, "passkey", 20, 0.1)         # the newest checkpoint's result is the one reported
    retrieval_result(exp, "needle", 20, 0.3)
    (exp / "eval" / "custom.json").write_text(json.dumps({"task": "passkey", "step": 99}))   # another name: ignored
    record = tmp_path / "rec.json"
    report = main([str(sweep), "--out", str(tmp_path / "out"), "--record", str(record)]).read_text()
    rows = [line for line in report.split("## Retrieval")[1].splitlines() if line.startswith("| exp |")]
    assert [r.split("|")[2].strip() for r in rows] == ["passkey", "needle"]      # the power run has none
    low, high = wilson_interval(20, 200)
    assert rows[0].split("|")[7].strip() == f"10.0% [{low:.1%}, {high:.1%}]"
    assert rows[0].split("|")[5].strip() == f"0.0% [0.0%, {wilson_interval(0, 40)[1]:.1%}]"   # 40 keys
    assert rows[0].split("|")[8].strip() == "10%, 0.001%"       # chance (digit, key) in percent, as the accuracies
    kept = json.loads(record.read_text())["retrieval"]
    assert [(e["label"], e["task"], e["step"]) for e in kept] == [("exp", "passkey", 20), ("exp", "needle", 20)]
    assert kept[0]["choice_accuracy"] == newest["choice_accuracy"]
    fake_run(tmp_path / "alone", "exp", 512, 0.1)
    assert "## Retrieval" not in main([str(tmp_path / "alone"), "--out", str(tmp_path / "o2")]).read_text()


def test_wilson_interval_against_its_closed_forms():
    from longctx.report.retrieval import Z95, wilson_interval

    z2 = Z95 ** 2
    assert wilson_interval(0, 50) == pytest.approx((0.0, z2 / (50 + z2)))          # no success: [0, z^2/(n+z^2)]
    assert wilson_interval(50, 50) == pytest.approx((50 / (50 + z2), 1.0))
    low, high = wilson_interval(10, 100)                                               # the textbook example
    assert (round(low, 4), round(high, 4)) == (0.0552, 0.1744)
    assert wilson_interval(30, 80)[0] == pytest.approx(1 - wilson_interval(50, 80)[1])   # symmetric in k <-> n-k


def test_labels_and_the_records_figures_are_chosen_on_the_command_line(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    for seed in range(2):
        fake_run(sweep / f"exp_s{seed}", "exp", 512, 0.1, seed=seed, doc_bins=True)
    fake_run(sweep / "power_s0", "power", 512, 0.05, seed=0, doc_bins=True)
    record = tmp_path / "rec.json"
    report = main([str(sweep), "--out", str(tmp_path / "out"), "--record", str(record), "--label", "exp=softmax",
                   "--label", "power_p2=power p=2", "--record-figures", "icl_curves"]).read_text()
    kept = json.loads(record.read_text())
    assert [(r["label"], r["seed_label"]) for r in kept["runs"]] == [
        ("softmax, seed=0", "softmax"), ("softmax, seed=1", "softmax"), ("power p=2, seed=0", "power p=2")]
    assert kept["figures"] == {"icl_curves": "rec_icl_curves.png"}
    assert "| softmax (2 seeds) |" in report and "| softmax (2 seeds) | power p=2 |" in report
    for argv, says in ((["--label", "nope=x"], "--label 'nope=x': give OLD=NEW, OLD one of the runs' labels or some of "
                                               "its parts (exp; power_p2)"),
                       (["--label", "exp"], "--label 'exp': give OLD=NEW"),
                       (["--record-figures", "icl"], "--record-figures icl: not a figure kind"),
                       (["--record-figures", "best_context_vs_context"], "best_context_vs_context not drawn for these")):
        with pytest.raises(SystemExit) as exit_:
            main([str(sweep), "--out", str(tmp_path / "o3"), "--record", str(tmp_path / "r3.json"), *argv])
        assert exit_.value.code == 2 and says in capsys.readouterr().err


def test_a_label_renames_its_parts_in_every_label_that_holds_them(tmp_path):
    """--label OLD=NEW with OLD some of a label's parts: renamed where they stand in every label holding them (one
    name for an arm at every N of a sweep over data), rules applied in order; a whole label still renames one group."""
    sweep = tmp_path / "sweep"
    for tag, lr in (("exp", 1e-3), ("exp", 3e-3), ("power", 1e-3)):
        for doc_len in (1024, 2048):
            fake_run(sweep / f"{tag}_{lr}_{doc_len}", tag, 512, 0.1, doc_bins=True,
                     change={"optim": {"lr": lr}, "data": {"doc_len": doc_len}})
    report = main([str(sweep), "--out", str(tmp_path / "out"), "--bootstrap", "10",
                   "--label", "exp, optim.lr=0.003=softmax", "--label", "data.doc_len=1024=short",
                   "--label", "power_p2, optim.lr=0.001, data.doc_len=2048=power, long"]).read_text()
    rows = report.split("## Intervals")[1].split("\n## ")[0].splitlines()
    labels = sorted(line.split("|")[1].strip() for line in rows if line.startswith("| ") and "| runs |" not in line)
    assert labels == ["exp, data.doc_len=2048, optim.lr=0.001", "exp, short, optim.lr=0.001", "power, long",
                      "power_p2, short, optim.lr=0.001", "softmax, data.doc_len=2048", "softmax, short"]


def test_equal_flops_count_every_stage_of_the_weights():
    """A later stage's evaluation is placed by the FLOPs its weights cost in every stage (flops_all_stages); a record
    from before that count by its own stage's FLOPs."""
    from pathlib import Path

    from longctx.report.runs import Run, training_flops

    stage2 = Run(path=Path("."), config={"attention": {"name": "exp"}, "ctx": 64},
                 records=[{"step": 1, "flops": 10.0, "flops_all_stages": 110.0, "best_context_loss": 2.0},
                          {"step": 2, "flops": 20.0, "flops_all_stages": 120.0, "best_context_loss": 1.5}])
    assert stage2.at_flops(115.0)["step"] == 1 and stage2.at_flops(125.0)["step"] == 2
    assert stage2.at_flops(100.0) is None            # its first stage alone cost more
    assert training_flops({"flops": 5.0}) == 5.0 and training_flops({}) is None
