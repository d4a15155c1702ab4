"""Compare runs: ICL curves overlaid, best-context loss against FLOPs and context, and a table, as Markdown + PNGs.

    python -m longctx.report RUN_DIR_OR_SWEEP_DIR... --out DIR [--at-flops 1e15] [--title TEXT]

A run directory is one holding metrics.jsonl (what the trainer writes, with config.yaml beside it); any other
folder is searched for run directories below it (a multirun sweep). DIR receives:

    report.md                  the table (each run's final evaluation, numbers as in its metrics.jsonl) + figures
    icl_curves.png             final ICL curves overlaid, colour = attention, the Bayes optimum dashed when known
                               (with --at-flops: each run's last evaluation within that FLOP budget instead)
    gap_to_optimum.png         the same curves minus the Bayes optimum, bin by bin, against the 0.05-nat line
                               (runs whose data has a known optimum; omitted when none has)
    best_context_vs_flops.png  best-context loss through training against training FLOPs
    best_context_vs_context.png  final best-context loss against the training context, one line per attention
    icl_over_training.png      every run's ICL curve at each evaluation (ICL vs updates), one panel per run
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from longctx.models.attention import CONF_ONLY_KEYS, attention_class

ATTENTION_COLORS = {"exp": "tab:blue", "linear": "tab:red", "window": "tab:green", "power": "tab:purple"}
LINESTYLES = ["-", "--", "-.", ":"]


@dataclass
class Run:
    path: Path
    config: dict
    records: list[dict]
    label: str = ""
    group_key: tuple = field(default_factory=tuple)
    name: str = ""  # the run in tables: its folder, with as many parent folders as tell it from the others

    @property
    def attention(self) -> str:
        return self.config["attention"]["name"]

    @property
    def tag(self) -> str:
        return self.config["attention"].get("tag", self.attention)

    @property
    def ctx(self) -> int:
        return int(self.config["ctx"])

    @property
    def final(self) -> dict:
        return self.records[-1]

    def at_flops(self, budget: float | None) -> dict | None:
        """The last evaluation within `budget` training FLOPs (the final one when budget is None)."""
        if budget is None:
            return self.final
        within = [r for r in self.records if r["flops"] <= budget]
        return within[-1] if within else None


# ----- loading ----------------------------------------------------------------------------------------------

def find_runs(paths: list[Path]) -> list[Path]:
    """Run directories (holding metrics.jsonl) among `paths` and below them, in path order, each once."""
    found = []
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such run or sweep directory")
        if (path / "metrics.jsonl").exists():
            found.append(path)
        else:
            found.extend(sorted(p.parent for p in path.rglob("metrics.jsonl")))
    runs = list(dict.fromkeys(p.resolve() for p in found))
    if not runs:
        raise FileNotFoundError(f"no metrics.jsonl under {', '.join(str(p) for p in paths)}: nothing to report")
    return runs


def load_run(path: Path) -> Run:
    records = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    if not records:
        raise ValueError(f"{path / 'metrics.jsonl'}: holds no evaluation yet")
    if not (path / "config.yaml").exists():
        raise FileNotFoundError(f"{path}: no config.yaml beside metrics.jsonl")
    config = OmegaConf.to_container(OmegaConf.load(path / "config.yaml"))
    return Run(path=path, config=config, records=records)


def name_runs(runs: list[Run]) -> None:
    """Each run's name: the shortest trailing part of its path that no other run shares (runs/exp/stage2 and
    runs/power/stage2 become exp/stage2 and power/stage2; distinct folder names stay as they are)."""
    def suffix(run: Run, depth: int) -> str:
        return "/".join(run.path.parts[-depth:])

    for run in runs:
        others = [r for r in runs if r is not run]
        depth = 1
        while depth < len(run.path.parts) and any(suffix(run, depth) == suffix(r, depth) for r in others):
            depth += 1
        run.name = suffix(run, depth)


def label_runs(runs: list[Run]) -> None:
    """Label each run by its attention plus whatever else differs between the runs (context, size, batch...)."""
    name_runs(runs)
    keys = {"ctx": lambda c: f"ctx {c['ctx']}", "model": lambda c: c["model"]["name"],
            "docs": lambda c: f"{c['data']['docs_per_batch']} docs/update",
            "reshape": lambda c: ("no reshape" if c["data"].get("reshape_block") is None
                                  else f"reshaped to {c['data']['reshape_block']}"),
            "data": lambda c: str(c["data"].get("tag", c["data"].get("name", "data"))),
            "doc_len": lambda c: f"{c['data'].get('doc_len')}-token documents",
            "arch": lambda c: c["arch"]["name"], "seed": lambda c: f"seed {c['seed']}",
            "rotary": lambda c: ("rotary on every head dim" if c["arch"].get("rope_dims") is None
                                 else f"rotary on {c['arch']['rope_dims']} head dims"),
            "token_shift": lambda c: "token shift" if c["arch"].get("token_shift") else "no token shift",
            "init": lambda c: (f"from {Path(str(c['trainer']['init_from'])).name}"
                               if c.get("trainer", {}).get("init_from") else "from scratch")}
    varying = [k for k, f in keys.items() if len({f(r.config) for r in runs}) > 1]
    params = {id(r): attention_params(r.config["attention"]) for r in runs}
    for run in runs:
        own = params[id(run)]
        # the attention's own parameters that differ between runs of that attention (sink=true, output_norm=false)
        differ = [f"{k}={_yaml(v)}" for k, v in own.items()
                  if len({_yaml(params[id(r)].get(k)) for r in runs if r.attention == run.attention}) > 1]
        parts = [run.tag] + [keys[k](run.config) for k in varying] + differ
        run.label = ", ".join(parts)
        run.group_key = tuple(keys[k](run.config) for k in varying if k != "ctx") + tuple(differ)


def attention_params(attention_cfg: dict) -> dict:
    """A run's attention parameters with the core's defaults filled in (a config written before a parameter
    existed ran with its default); an attention no longer registered keeps what its config says."""
    given = {k: v for k, v in attention_cfg.items() if k not in CONF_ONLY_KEYS}
    try:
        defaults = {f.name: f.default for f in dataclasses.fields(attention_class(attention_cfg["name"]).Params)}
    except ValueError:
        return given
    return {**defaults, **given}


def _yaml(value) -> str:
    return str(value).lower() if isinstance(value, bool) or value is None else str(value)


def per_position_curve(run: Run, record: dict) -> np.ndarray | None:
    if "per_position_loss" in record:
        return np.asarray(record["per_position_loss"])
    npy = run.path / "per_position_loss" / f"step_{record['step']:08d}.npy"
    return np.load(npy) if npy.exists() else None


# ----- figures ----------------------------------------------------------------------------------------------

def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _centers(curve: list) -> list[float]:
    return [math.sqrt(max(a, 1) * b) for a, b, _ in curve]


def _style(run: Run, runs: list[Run]) -> dict:
    """Colour = attention; line style = the run's other differences (size, batch, reshape) within that attention.
    Runs of one attention only (variants of it): a colour per variant instead."""
    same = [r.group_key for r in runs if r.attention == run.attention]
    order = list(dict.fromkeys(same))
    if len({r.attention for r in runs}) == 1 and len(order) > 1:
        return {"color": f"C{order.index(run.group_key) % 10}", "linestyle": "-"}
    return {"color": ATTENTION_COLORS.get(run.attention, "tab:gray"),
            "linestyle": LINESTYLES[order.index(run.group_key) % len(LINESTYLES)]}


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    _plt().close(fig)
    return path


def _log_x_axes(ax, xlabel: str, ylabel: str, title: str, base: int = 10) -> None:
    """The figures' common frame: log x axis, labelled axes, a small title, a light grid."""
    ax.set_xscale("log", base=base)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")


def _position_axes(ax, ylabel: str, title: str, budget: float | None) -> None:
    """Log position axis and a title naming which evaluation of each run is drawn."""
    when = "final evaluation" if budget is None else f"last evaluation within {budget:.3g} training FLOPs"
    _log_x_axes(ax, "position in context (tokens, log scale; bin centres)", ylabel, f"{title} ({when})")


def plot_icl_overlay(runs: list[Run], path: Path, title: str, budget: float | None) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5))
    optima = {}
    for run in runs:
        rec = run.at_flops(budget)
        if rec is None:
            continue
        ax.plot(_centers(rec["icl_curve"]), [v for *_, v in rec["icl_curve"]], marker=".", lw=1.5,
                label=f"{run.label} (step {rec['step']})", **_style(run, runs))
        if "bayes_curve" in rec:
            optima.setdefault(run.ctx, rec["bayes_curve"])
    for i, (ctx, curve) in enumerate(sorted(optima.items())):
        ax.plot(_centers(curve), [v for *_, v in curve], color="black", linestyle="--", lw=1.2,
                label="Bayes-optimal" + (f" (ctx {ctx})" if len(optima) > 1 else ""))
    _position_axes(ax, "heldout loss (nats/token)", f"{title}: ICL curves", budget)
    ax.legend(fontsize=7)
    return _save(fig, path)


def gap_curve(record: dict) -> list[tuple[int, int, float]]:
    """[(bin_start, bin_end, loss - Bayes-optimal loss), ...] of one evaluation; [] without a known optimum."""
    return [(a, b, loss - best) for (a, b, loss), (*_, best) in zip(record["icl_curve"],
                                                                       record.get("bayes_curve", []))]


def plot_gap_to_optimum(runs: list[Run], path: Path, title: str, budget: float | None,
                        target: float = 0.05) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5))
    for run in runs:
        rec = run.at_flops(budget)
        gaps = gap_curve(rec) if rec is not None else []
        if gaps:
            ax.plot(_centers(gaps), [g for *_, g in gaps], marker=".", lw=1.5,
                    label=f"{run.label} (step {rec['step']})", **_style(run, runs))
    ax.axhline(target, color="black", linestyle="--", lw=1, label=f"{target} nats above the optimum")
    ax.axhline(0.0, color="black", lw=0.8)
    _position_axes(ax, "heldout loss minus Bayes-optimal loss (nats/token)", f"{title}: gap to the optimum", budget)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.13))  # below: gaps fill the whole frame
    return _save(fig, path)


def plot_best_vs_flops(runs: list[Run], path: Path, title: str) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5))
    for run in runs:
        ax.plot([r["flops"] for r in run.records], [r["best_context_loss"] for r in run.records], marker="o",
                ms=3, lw=1.5, label=run.label, **_style(run, runs))
    _log_x_axes(ax, "training FLOPs (3x forward, charged with the form that runs; log scale)",
                "heldout best-context loss (nats/token)", f"{title}: best-context loss per FLOP")
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_best_vs_context(runs: list[Run], path: Path, title: str) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5))
    lines: dict[tuple, list[Run]] = {}
    for run in runs:
        lines.setdefault((run.tag, run.group_key), []).append(run)
    for (tag, key), members in lines.items():
        members = sorted(members, key=lambda r: r.ctx)
        ax.plot([r.ctx for r in members], [r.final["best_context_loss"] for r in members], marker="o", lw=1.5,
                label=", ".join((tag,) + key), **_style(members[0], runs))
    _log_x_axes(ax, "training context (tokens, log scale)", "final heldout best-context loss (nats/token)",
                f"{title}: best-context loss vs context", base=2)
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_icl_over_training(runs: list[Run], path: Path, title: str) -> Path:
    plt = _plt()
    cols = min(3, len(runs))
    rows = math.ceil(len(runs) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False, sharey=True)
    cmap = plt.get_cmap("viridis")
    for ax, run in zip(axes.flat, runs):
        for i, rec in enumerate(run.records):
            ax.plot(_centers(rec["icl_curve"]), [v for *_, v in rec["icl_curve"]], lw=1.2,
                    color=cmap(i / max(1, len(run.records) - 1)), label=f"step {rec['step']}")
        if "bayes_curve" in run.final:
            ax.plot(_centers(run.final["bayes_curve"]), [v for *_, v in run.final["bayes_curve"]], "k--", lw=1,
                    label="Bayes-optimal")
        ax.set_xscale("log")
        ax.set_title(run.label, fontsize=8)
        ax.set_xlabel("position (tokens, log)", fontsize=8)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=6)
    for ax in axes[:, 0]:
        ax.set_ylabel("heldout loss (nats/token)", fontsize=8)
    for ax in list(axes.flat)[len(runs):]:
        ax.set_visible(False)
    fig.suptitle(f"{title}: ICL curves through training", fontsize=10)
    return _save(fig, path)


# ----- table and report -------------------------------------------------------------------------------------

def _fmt_ratio(wsfr) -> str:
    if wsfr is None:
        return "-"
    if wsfr == float("inf"):
        return "inf:1"
    return f"{wsfr:.3g}:1" if wsfr >= 1 else f"1:{1 / wsfr:.3g}"


def table_rows(runs: list[Run]) -> list[dict]:
    """One row per run from its final evaluation, the numbers exactly as metrics.jsonl holds them."""
    rows = []
    for run in runs:
        rec = run.final
        rows.append({
            "run": run.name or run.path.name, "attention": run.tag, "ctx": run.ctx, "step": rec["step"], "tokens": rec["tokens"],
            "flops": rec["flops"], "best_context_loss": rec["best_context_loss"],
            "best_context_position": rec.get("best_context_position", rec["best_context_bin"][1]),
            "last10_loss": rec["last10_loss"], "best_context_gap": rec.get("best_context_gap"),
            "max_bin_gap": rec.get("max_bin_gap"),
            "state_size": rec.get("state_size"), "wsfr": rec.get("wsfr"), "tokens_per_s": rec.get("tokens_per_s"),
        })
    return rows


def markdown_table(rows: list[dict]) -> str:
    head = ("| run | attention | ctx | steps | training FLOPs | best-context loss | best-context position | "
            "last-10% loss | gap to optimum | largest gap over the curve | state size | WSFR | tokens/s |")
    lines = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    for r in rows:
        gap = "-" if r["best_context_gap"] is None else f"{r['best_context_gap']:+.3f}"
        largest = "-" if r["max_bin_gap"] is None else f"{r['max_bin_gap']:+.3f}"
        state = "-" if r["state_size"] is None else f"{r['state_size']:,}"
        speed = "-" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:,.0f}"
        lines.append(f"| {r['run']} | {r['attention']} | {r['ctx']} | {r['step']} | {r['flops']:.3g} | "
                     f"{r['best_context_loss']:.3f} | {r['best_context_position']} | {r['last10_loss']:.3f} | {gap} | "
                     f"{largest} | {state} | {_fmt_ratio(r['wsfr'])} | {speed} |")
    return "\n".join(lines)


def write_report(paths: list[Path], out: Path, title: str | None = None, at_flops: float | None = None) -> Path:
    runs = [load_run(p) for p in find_runs(paths)]
    label_runs(runs)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    title = title or ", ".join(dict.fromkeys(Path(p).name for p in paths))
    figures = [
        ("ICL curves", plot_icl_overlay(runs, out / "icl_curves.png", title, at_flops)),
    ]
    if any("bayes_curve" in run.final for run in runs):
        figures.append(("Gap to the Bayes optimum",
                        plot_gap_to_optimum(runs, out / "gap_to_optimum.png", title, at_flops)))
    figures += [
        ("Best-context loss vs training FLOPs", plot_best_vs_flops(runs, out / "best_context_vs_flops.png", title)),
        ("Best-context loss vs context", plot_best_vs_context(runs, out / "best_context_vs_context.png", title)),
        ("ICL curves through training", plot_icl_over_training(runs, out / "icl_over_training.png", title)),
    ]
    text = [f"# {title}", "", f"{len(runs)} runs: " + ", ".join(f"`{r.name}`" for r in runs), "",
            "Final evaluation of each run (heldout; losses in nats/token; best context = the lowest bin of the "
            "binned ICL curve among bins of at least 16 positions, its position the bin's end).", "",
            markdown_table(table_rows(runs)), ""]
    for name, png in figures:
        text += [f"## {name}", "", f"![{name}]({png.name})", ""]
    report = out / "report.md"
    report.write_text("\n".join(text))
    return report


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m longctx.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="run directories or sweep directories above them")
    parser.add_argument("--out", type=Path, required=True, help="folder for report.md and the PNGs")
    parser.add_argument("--title", default=None, help="figure and report title (default: the folders' names)")
    parser.add_argument("--at-flops", type=float, default=None,
                        help="overlay each run's ICL curve at its last evaluation within this many training FLOPs")
    args = parser.parse_args(argv)
    try:
        report = write_report(args.paths, args.out, args.title, args.at_flops)
    except (FileNotFoundError, ValueError) as err:
        parser.exit(2, f"error: {err}\n")
    print(report)
    return report


if __name__ == "__main__":
    main()
