"""scripts/plot_results.py redraws every docs/results plot from its committed JSON, and names an unknown table."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"


def test_every_results_json_has_a_plot_and_redraws(tmp_path, import_script):
    plot_results = import_script("plot_results")
    tables = sorted(p.stem for p in RESULTS.glob("*.json"))
    assert tables == sorted(plot_results.PLOTS)            # one plot per JSON, no orphan on either side
    for table in tables:
        shutil.copy(RESULTS / f"{table}.json", tmp_path)
    written = plot_results.main(["--dir", str(tmp_path)])
    assert sorted(p.name for p in written) == sorted(f"{t}.png" for t in tables)
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for table in tables:                                   # the committed plots are there too
        assert (RESULTS / f"{table}.png").exists()


def test_unknown_table_is_named(import_script, capsys):
    plot_results = import_script("plot_results")
    with pytest.raises(SystemExit):
        plot_results.main(["kernels"])
    assert "unknown table 'kernels'" in capsys.readouterr().err


def test_a_folder_without_records_is_one_line(tmp_path, import_script, capsys):
    """A report's --out folder (report.md, intervals.json) holds no record: refused in one line, exit 2, nothing drawn
    (it printed nothing and exited 0)."""
    plot_results = import_script("plot_results")
    (tmp_path / "intervals.json").write_text("{}")
    (tmp_path / "report.md").write_text("# r\n")
    with pytest.raises(SystemExit) as exit_:
        plot_results.main(["--dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.strip().count("\n") == 0
    assert err.startswith(f"error: --dir {tmp_path}: no record to draw (intervals.json: none is one); ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["intervals.json", "report.md"]
    with pytest.raises(SystemExit) as exit_:   # a table named but not in --dir (it was a KeyError traceback)
        plot_results.main(["--dir", str(tmp_path), "kernel_benchmark"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (f"error: --dir {tmp_path} has no kernel_benchmark.json (the record "
                                       f"'kernel_benchmark' is drawn from)\n")


def _shown(fig) -> dict[str, np.ndarray]:
    """{legend label: y values} of the lines a figure draws (the numbers it shows)."""
    return {line.get_label(): np.asarray(line.get_ydata(), float) for line in fig.axes[0].get_lines()
            if not line.get_label().startswith("_")}


def _expected(compact: dict, kind: str) -> dict[str, np.ndarray]:
    """What the figure must show, straight from the record: each group's mean final curve over its seeds (minus
    the optimum for a gap figure), under the group's label in words."""
    from longctx.plotting import readable_label
    groups: dict[str, list] = {}
    for run in compact["runs"]:
        final = run["records"][-1]
        curve = np.array([v for *_, v in final["icl_curve"]])
        if kind == "gap_to_optimum":
            curve = curve - np.array([v for *_, v in final["bayes_curve"]])
        groups.setdefault(run["seed_label"], []).append((curve, final["step"]))
    out = {}
    for label, members in groups.items():
        seeds = f" ({len(members)} seeds)" if len(members) > 1 else ""
        out[f"{readable_label(label)}{seeds} (step {members[0][1]})"] = np.mean([c for c, _ in members], axis=0)
    return out


def test_a_compact_report_record_redraws_with_bands(tmp_path, import_script, caplog):
    """`longctx.report --record` writes a compact record (per-document npz beside it); plot_results redraws its
    figures from it alone, curves and bands equal to the report's."""
    from report_fixtures import fake_run

    from longctx.report import main
    from longctx.report.stats import load_doc_bins, seed_aggregate
    plot_results = import_script("plot_results")
    for seed in (0, 1):
        fake_run(tmp_path / "runs" / f"exp_s{seed}", "exp", 512, 0.1, seed=seed, doc_bins=True)
    fake_run(tmp_path / "runs" / "power", "power", 512, 0.05, doc_bins=True)
    docs = tmp_path / "docs"
    docs.mkdir()
    main([str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--record", str(docs / "cmp.json"),
          "--bootstrap", "100"])
    shutil.rmtree(tmp_path / "runs")                         # the record alone redraws
    compact = json.loads((docs / "cmp.json").read_text())
    assert compact["kind"] == "report" and sorted(p.name for p in docs.glob("*.npz")) == ["cmp.npz"]
    assert [r["doc_bins"] for r in compact["runs"]] == ["cmp.npz#r0_", "cmp.npz#r1_", "cmp.npz#r2_"]
    written = plot_results.main(["--dir", str(docs)])
    assert sorted(p.name for p in written) == sorted(compact["figures"].values())
    from longctx.report.record import draw_record
    fig = draw_record(compact, docs, n_boot=100)["gap_to_optimum"]
    shown = _shown(fig)
    for label, values in _expected(compact, "gap_to_optimum").items():
        np.testing.assert_allclose(shown[label], values, atol=1e-12)
    band = fig.axes[0].collections[0].get_paths()[0].vertices[:, 1]
    iv = seed_aggregate([load_doc_bins(docs / "cmp.npz", r["doc_bins"].split("#")[1]) for r in compact["runs"][:2]],
                        "gap_curve", 100)
    assert np.isclose(band.min(), iv.low.min()) and np.isclose(band.max(), iv.high.max())

    (docs / "cmp.npz").unlink()                              # the arrays gone: the warning names the record
    with caplog.at_level("WARNING", logger="longctx.report"):
        draw_record(compact, docs, n_boot=100, name="cmp")
    assert f"{docs / 'cmp.npz'}: named by cmp.json (step " in caplog.text and "metrics.jsonl" not in caplog.text


def _drawn(plot_results, monkeypatch, table: str):
    """The figure plot_results draws for docs/results/<table>.json, kept open to read back."""
    import matplotlib.pyplot as plt
    kept = []
    monkeypatch.setattr(plt, "close", lambda fig=None: kept.append(fig))
    record = json.loads((RESULTS / f"{table}.json").read_text())
    return record, lambda path: (plot_results.PLOTS[table](record, path), kept[-1])[1]


def test_results_figures_show_their_records_numbers(tmp_path, import_script, monkeypatch):
    """kernel_benchmark, bench_train, ddp_scaling, wsfr and default_cpu_run: every line or bar the figure shows is
    its record's number (bench_decode and train_paths_loss are drawn by their own scripts, tested there)."""
    plot_results = import_script("plot_results")

    record, draw = _drawn(plot_results, monkeypatch, "kernel_benchmark")
    fig = draw(tmp_path / "k.png")
    for ax, mode in zip(fig.axes, ("fwdbwd", "fwd")):
        for line in ax.get_lines():
            impl = {v: k for k, v in plot_results.IMPL_LABELS.items()}[line.get_label()]
            rows = sorted((r["t"], r["ms"]) for r in record["rows"] if r["impl"] == impl and r["mode"] == mode)
            assert list(zip(line.get_xdata(), line.get_ydata())) == rows

    record, draw = _drawn(plot_results, monkeypatch, "bench_train")
    fig = draw(tmp_path / "b.png")
    heights = sorted(round(b.get_height(), 6) for ax in fig.axes for b in ax.patches if b.get_height() > 0)
    assert heights == sorted(round(r["tokens_per_s"] / 1e3, 6) for r in record["rows"] if not r.get("error"))

    record, draw = _drawn(plot_results, monkeypatch, "ddp_scaling")
    fig = draw(tmp_path / "d.png")
    gpus = sorted(int(n) for n in record["runs"])
    assert [b.get_height() for b in fig.axes[0].patches] == pytest.approx(
        [record["runs"][str(n)][-1]["tokens_per_s"] / 1e3 for n in gpus])

    record, draw = _drawn(plot_results, monkeypatch, "wsfr")
    fig = draw(tmp_path / "w.png")
    for line in fig.axes[0].get_lines():
        named = {plot_results.attention_label(r["attention"]): r["attention"] for r in record["rows"]}  # exp: softmax
        if line.get_linestyle() == "-" and line.get_label() in named:
            rows = sorted((r for r in record["rows"] if r["attention"] == named[line.get_label()]),
                          key=lambda r: r["ctx"])
            assert list(line.get_ydata()) == [r["wsfr_no_lm_head"] for r in rows]

    record, draw = _drawn(plot_results, monkeypatch, "default_cpu_run")
    fig = draw(tmp_path / "c.png")
    lines = {line.get_label(): list(line.get_ydata()) for line in fig.axes[0].get_lines()}
    final = record["records"][-1]
    assert lines[f"step {final['step']} (final)"] == [v for *_, v in final["icl_curve"]]
    assert lines["Bayes-optimal"] == [v for *_, v in final["bayes_curve"]]


def test_a_record_naming_an_unknown_figure_is_one_line(tmp_path, import_script, capsys):
    plot_results = import_script("plot_results")
    (tmp_path / "x.json").write_text(json.dumps({"kind": "report", "title": "t", "figures": {"heatmap": "x.png"},
                                                 "runs": []}))
    with pytest.raises(SystemExit) as exit_:
        plot_results.main(["--dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "unknown kind 'heatmap'" in err and err.strip().count("\n") == 0


def test_every_committed_report_record_redraws_with_its_numbers(tmp_path, import_script):
    """Each compact report record in docs/results/experiments (`longctx.report --record`: the seeded sweeps) redraws
    every figure it names with the record's own curves (the seeds' mean), and that figure is committed."""
    from longctx.report.record import draw_record
    import matplotlib.pyplot as plt
    plot_results = import_script("plot_results")
    compacts = [p for p in (RESULTS / "experiments").glob("*.json") if plot_results._is_compact(p)]
    assert compacts, "no compact report record committed"
    for path in compacts:
        compact = json.loads(path.read_text())
        assert all("doc_bins" in r for r in compact["runs"]), f"{path.name}: runs without per-document records"
        for kind, png in compact["figures"].items():
            assert (path.parent / png).exists(), f"{path.name}: {png} is not committed"
            fig = draw_record(compact, path.parent, n_boot=50, name=path.stem)[kind]
            if kind == "claims":  # each claim's difference of the seed means, one row a claim, in the file's order
                from longctx.report.findings import judge

                points = [line.get_xdata()[0] for line in fig.axes[0].get_lines() if line.get_marker() == "o"]
                assert points == pytest.approx([j["difference"][0] for j in judge(path, n_boot=50)], abs=1e-9)
            if kind in ("icl_curves", "gap_to_optimum"):
                shown = _shown(fig)
                for label, values in _expected(compact, kind).items():
                    np.testing.assert_allclose(shown[label], values, rtol=0, atol=1e-6, err_msg=f"{path.name}: {label}")
            plt.close(fig)
