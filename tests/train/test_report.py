"""python -m longctx.report: the table equals the runs' own metrics.jsonl, the figures are written, bad input fails
with one line naming the path."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from longctx.report import find_runs, gap_curve, load_run, main
from longctx.train.metrics import icl_summary

REPO = Path(__file__).resolve().parents[2]


def fake_run(folder: Path, attention: str, ctx: int, offset: float, steps=(10, 20), npy: bool = False,
             init_from: str | None = None) -> Path:
    """A run directory as the trainer writes it: config.yaml + one metrics.jsonl record per evaluation, each
    summarised by the real icl_summary from a known per-position curve."""
    folder.mkdir(parents=True)
    tag = {"power": "power_p2"}.get(attention, attention)
    OmegaConf.save(OmegaConf.create({
        "ctx": ctx, "seed": 0, "arch": {"name": "gpt2"}, "attention": {"name": attention, "tag": tag},
        "model": {"name": "d256l4"}, "data": {"docs_per_batch": 32, "reshape_block": None},
        "trainer": {"init_from": init_from}}), folder / "config.yaml")
    bayes = 1.0 + 2.0 / np.sqrt(np.arange(ctx) + 1.0)
    with open(folder / "metrics.jsonl", "w") as f:
        for i, step in enumerate(steps):
            curve = bayes + offset + 0.5 / (i + 1)
            rec = {"step": step, "tokens": step * 1000, "flops": step * 1e12 * (2 if attention == "exp" else 1),
                   "train_loss": float(curve.mean()), "tokens_per_s": 12345.6 + i, "state_size": 1000 * ctx,
                   "wsfr": 0.25, **icl_summary(curve, 12, bayes)}
            if npy:
                (folder / "per_position_loss").mkdir(exist_ok=True)
                np.save(folder / "per_position_loss" / f"step_{step:08d}.npy", curve.astype(np.float32))
            else:
                rec["per_position_loss"] = [round(float(x), 5) for x in curve]
            f.write(json.dumps(rec) + "\n")
    return folder


def test_report_table_equals_the_runs_metrics(tmp_path):
    sweep = tmp_path / "sweep"
    runs = [fake_run(sweep / "0_exp", "exp", 1024, 0.1), fake_run(sweep / "1_power", "power", 1024, 0.05),
            fake_run(sweep / "2_window", "window", 2048, 0.2, npy=True)]
    extra = fake_run(tmp_path / "single", "linear", 2048, 0.3)
    report = main([str(sweep), str(extra), "--out", str(tmp_path / "out"), "--title", "test"])
    text = report.read_text()
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]]
            for line in text.splitlines() if re.match(r"\| \d_|\| single", line)}
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
    for png in ("icl_curves.png", "gap_to_optimum.png", "best_context_vs_flops.png", "best_context_vs_context.png",
                "icl_over_training.png"):
        assert (tmp_path / "out" / png).stat().st_size > 10_000
        assert f"]({png})" in text


def test_gap_curve_is_the_binned_loss_minus_the_optimum(tmp_path):
    """fake_run's curve is the optimum + 0.1 + 0.5 / (evaluation + 1): the gap is that constant in every bin,
    and the largest bin gap the trainer logged is the largest of them."""
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
    from longctx.report import load_run
    assert load_run(tmp_path / "a").at_flops(3e13)["step"] == 10
    assert load_run(tmp_path / "b").at_flops(3e13)["step"] == 30
    main([str(tmp_path), "--out", str(tmp_path / "out"), "--at-flops", "3e13"])
    assert (tmp_path / "out" / "icl_curves.png").exists()


def test_labels_tell_a_run_started_from_another_runs_weights(tmp_path):
    from longctx.report import label_runs, load_run
    runs = [load_run(fake_run(tmp_path / "scratch", "exp", 512, 0.1)),
            load_run(fake_run(tmp_path / "warm", "exp", 512, 0.1, init_from=str(tmp_path / "short_run")))]
    label_runs(runs)
    assert [r.label for r in runs] == ["exp, from scratch", "exp, from short_run"]


def test_variants_of_one_attention_are_labelled_and_coloured_apart(tmp_path):
    from longctx.report import _style, label_runs, load_run
    variants = {"plain": {}, "sink": {"attention": {"sink": True}}, "rope16": {"arch": {"rope_dims": 16}},
                "shift": {"arch": {"token_shift": True}}}
    runs = []
    for name, change in variants.items():
        folder = fake_run(tmp_path / name, "exp", 512, 0.1)
        OmegaConf.save(OmegaConf.merge(OmegaConf.load(folder / "config.yaml"), change), folder / "config.yaml")
        runs.append(load_run(folder))
    label_runs(runs)
    assert [r.label for r in runs] == [  # no sink or token_shift key: the default
        "exp, rotary on every head dim, no token shift, sink=false",
        "exp, rotary on every head dim, no token shift, sink=true",
        "exp, rotary on 16 head dims, no token shift, sink=false",
        "exp, rotary on every head dim, token shift, sink=false"]
    assert len({_style(r, runs)["color"] for r in runs}) == 4
    power = load_run(fake_run(tmp_path / "power", "power", 512, 0.1))  # two attentions: colour = attention again
    assert _style(runs[0], runs + [power])["color"] == _style(runs[1], runs + [power])["color"]
    normed = fake_run(tmp_path / "normed", "power", 512, 0.1)
    OmegaConf.save(OmegaConf.merge(OmegaConf.load(normed / "config.yaml"), {"attention": {"output_norm": True}}),
                   normed / "config.yaml")
    both = [power, load_run(normed), runs[0]]
    label_runs(both)  # a power parameter that differs labels the power runs only
    assert [r.label for r in both] == ["power_p2, output_norm=false", "power_p2, output_norm=true", "exp"]


def test_runs_sharing_a_folder_name_are_told_apart_by_their_parents(tmp_path):
    from longctx.report import main
    fake_run(tmp_path / "exp" / "stage2", "exp", 512, 0.1)
    fake_run(tmp_path / "power" / "stage2", "power", 512, 0.1)
    fake_run(tmp_path / "solo", "linear", 512, 0.1)
    report = main([str(tmp_path), "--out", str(tmp_path / "out")]).read_text()
    rows = [line.split(" | ")[0].lstrip("| ") for line in report.splitlines() if line.startswith("| ")][1:]
    assert sorted(rows) == ["exp/stage2", "power/stage2", "solo"]


def test_bad_input_is_one_line_naming_the_path(tmp_path):
    out = subprocess.run([sys.executable, "-m", "longctx.report", str(tmp_path / "missing"), "--out",
                          str(tmp_path / "o")], capture_output=True, text=True)
    assert out.returncode == 2 and "missing" in out.stderr and "Traceback" not in out.stderr
    (tmp_path / "empty").mkdir()
    out = subprocess.run([sys.executable, "-m", "longctx.report", str(tmp_path / "empty"), "--out",
                          str(tmp_path / "o")], capture_output=True, text=True)
    assert out.returncode == 2 and "no metrics.jsonl" in out.stderr
