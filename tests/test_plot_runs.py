"""scripts/plot_runs.py: a run still writing (cut last line) is drawn from its complete records with a warning
naming the file and line; bad input is one line and exit 2, nothing written; the legend sits clear of the axes."""
from __future__ import annotations

import json

import pytest


def _run(folder, scale: float, cut: bool = False):
    folder.mkdir()
    lines = [json.dumps({"step": s, "tokens": 100 * s, "flops": 1e12 * scale * s, "best_context_loss": 2.0 / s})
             for s in (1, 2, 3)]
    text = "\n".join(lines) + "\n"
    (folder / "metrics.jsonl").write_text(text[:-20] if cut else text)
    return folder


def test_a_cut_line_is_skipped_and_named(tmp_path, import_script, capsys, monkeypatch):
    plot_runs = import_script("plot_runs")
    a, b = _run(tmp_path / "a", 1.0), _run(tmp_path / "b", 2.0, cut=True)
    drawn = {}
    monkeypatch.setattr(plot_runs.plt, "close", lambda fig: drawn.setdefault("fig", fig))
    plot_runs.main([str(a), str(b), "-o", str(tmp_path / "cmp.png")])
    assert f"{b / 'metrics.jsonl'}:3: incomplete line skipped" in capsys.readouterr().err
    ax = drawn["fig"].axes[0]
    lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}
    assert lines["a"] == ([1e12, 2e12, 3e12], [2.0, 1.0, 2.0 / 3])
    assert lines["b"] == ([2e12, 4e12], [2.0, 1.0])                    # its two complete records
    fig = drawn["fig"]
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    legend, label = ax.get_legend().get_window_extent(r), ax.xaxis.label.get_window_extent(r)
    assert legend.x0 > ax.get_window_extent(r).x1 and not legend.overlaps(label)


@pytest.mark.parametrize("args, message", [(["--y", "nonsense"], "--y='nonsense'"), (["-o", "{tmp}"], "-o "),
                                           (["-o", "{tmp}/missing/x.png"], "-o ")])
def test_bad_input_is_one_line_exit_2(tmp_path, import_script, capsys, args, message):
    plot_runs = import_script("plot_runs")
    a = _run(tmp_path / "a", 1.0)
    args = [arg.replace("{tmp}", str(tmp_path)) for arg in args]
    with pytest.raises(SystemExit) as exit_:
        plot_runs.main([str(a), *args] + ([] if "-o" in args else ["-o", str(tmp_path / "x.png")]))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and err.strip().count("\n") == 0
    assert not (tmp_path / "x.png").exists()


def test_flops_and_tokens_count_the_stages_before(tmp_path, import_script, monkeypatch):
    """A run started from another's weights (a later stage) records its own stage's flops and tokens and, in
    flops_all_stages / tokens_all_stages, the weights' whole training: the loss-per-FLOP view draws the latter."""
    plot_runs = import_script("plot_runs")
    later = tmp_path / "stage2"
    later.mkdir()
    (later / "metrics.jsonl").write_text("".join(json.dumps(
        {"step": s, "tokens": 100 * s, "flops": 1e12 * s, "tokens_all_stages": 500 + 100 * s,
         "flops_all_stages": 5e12 + 1e12 * s, "best_context_loss": 2.0 / s}) + "\n" for s in (1, 2)))
    for x, want in (("flops", [6e12, 7e12]), ("tokens", [600, 700]), ("step", [1, 2])):
        drawn = {}
        monkeypatch.setattr(plot_runs.plt, "close", lambda fig: drawn.setdefault("fig", fig))
        plot_runs.main([str(later), "--x", x, "-o", str(tmp_path / f"{x}.png")])
        assert list(drawn["fig"].axes[0].get_lines()[0].get_xdata()) == want


def test_the_default_output_is_named_and_never_written_over(tmp_path, import_script, capsys, monkeypatch):
    """Without -o the figure lands in the current folder as runs_comparison.png and the line printed is its absolute
    path; a second run refuses the existing file (kept byte for byte) until --overwrite is given."""
    plot_runs = import_script("plot_runs")
    a = _run(tmp_path / "a", 1.0)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    plot_runs.main([str(a)])
    written = work / "runs_comparison.png"
    assert capsys.readouterr().out.strip() == f"wrote {written}" and written.stat().st_size > 5000
    before = written.read_bytes()
    with pytest.raises(SystemExit) as exit_:
        plot_runs.main([str(a), "--x", "step"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"-o {written}: exists; pass --overwrite" in err, err
    assert written.read_bytes() == before
    plot_runs.main([str(a), "--x", "step", "--overwrite", "-o", "runs_comparison.png"])
    assert capsys.readouterr().out.strip() == f"wrote {written}" and written.read_bytes() != before


def test_a_file_joined_from_two_runs_is_refused_as_the_report_refuses_it(tmp_path, import_script, capsys):
    plot_runs = import_script("plot_runs")
    a = _run(tmp_path / "a", 1.0)
    (a / "metrics.jsonl").write_text((a / "metrics.jsonl").read_text() * 2)   # another run's records appended
    with pytest.raises(SystemExit) as exit_:
        plot_runs.main([str(a), "-o", str(tmp_path / "x.png")])
    assert exit_.value.code == 2 and capsys.readouterr().err.strip() == (
        f"error: {a / 'metrics.jsonl'}:4: step 1 after step 3: an evaluation repeated or out of order (a file edited "
        f"or joined from two runs?)")
    assert not (tmp_path / "x.png").exists()
