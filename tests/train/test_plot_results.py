"""scripts/plot_results.py redraws every docs/results plot from its committed JSON, and names an unknown table."""
import json
import shutil
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


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


def test_experiment_records_drawn_from_themselves_redraw(tmp_path, import_script):
    """The docs/results/experiments records with a plot of their own redraw from the committed JSON, and every
    variant the figure names has the final ICL curve and the optimum's on the same bins."""
    plot_results = import_script("plot_results")
    for table in plot_results.EXPERIMENT_PLOTS:
        src = RESULTS / "experiments" / f"{table}.json"
        record = json.loads(src.read_text())
        for key in record["variants"]:
            final = record[key]["stage2_ctx4096"]
            assert [b[:2] for b in final["icl_curve"]] == [b[:2] for b in final["bayes_curve"]]
            assert abs(max(a[2] - b[2] for a, b in zip(final["icl_curve"], final["bayes_curve"]))
                       - final["max_bin_gap"]) < 1e-9          # the figure's largest gap is the run's own
        shutil.copy(src, tmp_path)
        (written,) = plot_results.main(["--dir", str(tmp_path), table])
        assert written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (RESULTS / "experiments" / f"{table}.png").exists()
