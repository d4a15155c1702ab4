"""scripts/plot_results.py redraws every docs/results plot from its committed JSON, and names an unknown table."""
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
