"""Compare runs: ICL curves, best-context loss, bootstrap intervals over heldout documents, seeds aggregated,
paired differences; `python -m longctx.report RUNS... --out DIR` (usage and outputs: longctx.report.cli).

    stats    the bootstrap (pure numpy): intervals of a run's statistics, paired differences, seed aggregates
    runs     finding and reading run folders, labels from the configs' differences, groups of seeds
    figures  the figures;  record  the compact records scripts/plot_results.py redraws them from
"""
from longctx.report.cli import main, write_report
from longctx.report.figures import gap_curve
from longctx.report.runs import Run, find_runs, label_runs, load_run, load_runs

__all__ = ["Run", "find_runs", "gap_curve", "label_runs", "load_run", "load_runs", "main", "write_report"]
