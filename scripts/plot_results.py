"""Redraw the plots of docs/results/ from their JSON records (no GPU, no training: the numbers are read, not measured).

    python scripts/plot_results.py                     # every <table>.json in docs/results -> <table>.png
    python scripts/plot_results.py --dir out kernel_benchmark
    python scripts/plot_results.py --dir docs/results/experiments   # the experiment figures whose records are here

In docs/results/experiments: some records draw a figure of their own (EXPERIMENT_PLOTS); the report's figures are
redrawn by longctx.report's own figure code from the final curves the records keep (REPORT_FIGURES), and from any
compact report record (`python -m longctx.report RUNS --out DIR --record NAME.json`: a JSON with "kind": "report"
and its per-document npz beside it), whose figures are written as the record names them.
Each JSON carries the command that measured it; README.md's "Results" quotes the same records.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from longctx.train.loggers import plot_icl_curves  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
IMPL_LABELS = {"longctx_p2": "longctx", "power_attention_1.4.4_p2": "power-attention 1.4.4",
               "sdpa_cudnn": "SDPA cuDNN (softmax)"}


def _ctx_label(t: int) -> str:
    return f"{t // 1024}k" if t % 1024 == 0 else f"{t:,}"


def _finish(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_kernel_benchmark(record: dict, path: Path) -> Path:
    """Milliseconds against context length, forward and forward+backward side by side, log-log."""
    rows = record["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, mode, name in zip(axes, ("fwdbwd", "fwd"), ("forward + backward", "forward")):
        for impl, label in IMPL_LABELS.items():
            pts = sorted((r["t"], r["ms"]) for r in rows if r["impl"] == impl and r["mode"] == mode)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=label)
        ctxs = sorted({r["t"] for r in rows})
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ctxs, [_ctx_label(t) for t in ctxs])
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("time per call (ms, lower is better)")
        ax.set_title(f"{name}: b=8, h=12, d=64, bf16, p=2", fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(f"Power-attention kernels ({record['env']['gpu']})", fontsize=11)
    return _finish(fig, path)


ROW_NAMES = {"exp": "exp (softmax)", "power": "power p=2", "none": "no attention (ceiling)"}


def plot_bench_train(record: dict, path: Path) -> Path:
    """scripts/bench_train.py: tokens/s of each row (attention@ctx) per arch, one bar per variant."""
    rows = [r for r in record["rows"] if not r.get("error")]
    archs = list(dict.fromkeys(r["arch"] for r in rows))
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    fig, axes = plt.subplots(1, len(archs), figsize=(6 * len(archs), 4.4), squeeze=False)
    for ax, arch in zip(axes[0], archs):
        groups = list(dict.fromkeys((r["attention"], r["ctx"]) for r in rows if r["arch"] == arch))
        rate = {(r["attention"], r["ctx"], r["variant"]): r["tokens_per_s"] / 1e3 for r in rows if r["arch"] == arch}
        width = 0.8 / len(variants)
        for i, variant in enumerate(variants):
            xs = [g + (i - (len(variants) - 1) / 2) * width for g in range(len(groups))]
            first = next(r for r in rows if r["variant"] == variant)
            label = (f"{variant}: compile {first['compile'].lower()}, checkpointing "
                     f"{'on' if first['checkpointing'] else 'off'}")
            bars = ax.bar(xs, [rate.get((a, c, variant), 0.0) for a, c in groups], width, label=label)
            ax.bar_label(bars, fmt="%.0f", fontsize=7)
        ax.set_xticks(range(len(groups)), [f"{ROW_NAMES.get(a, a)}\nctx {_ctx_label(c)}" for a, c in groups],
                      fontsize=8)
        ax.set_ylabel("training throughput (k tokens/s)")
        ax.set_title(f"{arch.upper().replace('GPT2', 'GPT-2')} small, train.py experiment=paper", fontsize=10)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    fig.suptitle(f"Training speed through the trainer ({record['device']}, bf16)", fontsize=11)
    return _finish(fig, path)


def plot_ddp_scaling(record: dict, path: Path) -> Path:
    """Tokens/s of the last step on 1..N GPUs beside perfect scaling from one GPU."""
    gpus = sorted(int(n) for n in record["runs"])
    rates = [record["runs"][str(n)][-1]["tokens_per_s"] / 1e3 for n in gpus]
    fig, ax = plt.subplots(figsize=(6, 4.2))
    ax.bar([str(n) for n in gpus], rates, 0.5, label="measured")
    ax.plot([str(n) for n in gpus], [rates[0] * n / gpus[0] for n in gpus], "k--", marker="_", label="perfect scaling")
    for i, r in enumerate(rates):
        ax.annotate(f"{r:.1f}k\n({r / rates[0]:.2f}x)", (i, r / 2), ha="center", va="center", color="white",
                    fontsize=10)
    ax.set_ylim(0, max(rates) * 1.15)
    ax.set_xlabel("GPUs (DDP, same global batch)")
    ax.set_ylabel("training throughput (k tokens/s)")
    ax.set_title(f"GPT-2 small, power p=2, ctx 64k ({record['env']['gpu']})", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return _finish(fig, path)


def plot_wsfr(record: dict, path: Path) -> Path:
    """Weight-to-state FLOP ratio against context, one line per attention, the paper's values as crosses."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for attention in dict.fromkeys(r["attention"] for r in record["rows"]):
        rows = sorted((r for r in record["rows"] if r["attention"] == attention), key=lambda r: r["ctx"])
        line, = ax.plot([r["ctx"] for r in rows], [r["wsfr_no_lm_head"] for r in rows], marker="o", label=attention)
        paper = [(r["ctx"], _ratio(r["paper_wsfr"])) for r in rows if r.get("paper_wsfr")]
        if paper:
            ax.plot(*zip(*paper), "x", color=line.get_color(), ms=9, mew=2)
    ax.plot([], [], "kx", ms=9, mew=2, label="paper's table")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("WSFR = weight FLOPs / state FLOPs\n(per token, LM head excluded)")
    ax.set_title(f"Weight-to-state FLOP ratio, {record['model']}", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return _finish(fig, path)


def _ratio(text: str) -> float:
    a, b = text.split(":")
    return float(a) / float(b)


def plot_default_cpu_run(record: dict, path: Path) -> Path:
    return plot_icl_curves(record["records"], path, "Default run (GPT-2 tiny, ICL Markov data, ctx 128, CPU): "
                           "heldout loss by position")


def plot_bench_decode(record: dict, path: Path) -> Path:
    """The decoding benchmark's own figure (scripts/bench_decode.py draws it; one drawing for both)."""
    _script("bench_decode").plot(record, path)
    return path


def _script(name: str):
    """Another script of scripts/ as a module (they are files, not a package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def plot_icl_variant_gaps(record: dict, path: Path) -> Path:
    """Experiment records of the form {"variants": {key: label}, key: {"stage2_ctx4096": final record}}: each
    variant's gap to the optimum per ICL bin (loss minus the optimum's, same bins), log position axis."""
    fig, ax = plt.subplots(figsize=(8.5, 4.6))
    for key, label in record["variants"].items():
        final = record[key]["stage2_ctx4096"]
        ends = [hi for _, hi, _ in final["icl_curve"]]
        gaps = [got - best for (_, _, got), (_, _, best) in zip(final["icl_curve"], final["bayes_curve"])]
        ax.plot(ends, gaps, marker="o", ms=3.5, label=f"{label} (update {final['step']})")
    ax.axhline(0.0, color="black", lw=0.8)
    ax.axhspan(-0.05, 0.05, color="grey", alpha=0.12, lw=0, label="within 0.05 nats of the optimum")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("position in the document (bin end, tokens; log scale)")
    ax.set_ylabel("loss above the Bayes optimum (nats/token)")
    ax.set_title(record.get("title", "Gap to the optimum per position bin"), fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7.5)
    return _finish(fig, path)


def plot_train_paths_loss(record: dict, path: Path) -> Path:
    """scripts/compare_train_paths.py's own figure (it draws it too; one drawing for both)."""
    return _script("compare_train_paths").plot_train_paths_loss(record, path)


# ----- the report's figures from the experiment records (final curves per run) ------------------------------

def _compact(title: str, kind: str, png: str, runs: list[dict]) -> dict:
    return {"kind": "report", "title": title, "figures": {kind: png}, "runs": runs}


def _entry(name: str, label: str, final: dict, heldout: str, seed=None, seed_label=None) -> dict:
    return {"name": name, "label": label, "seed_label": seed_label or label, "seed": seed,
            "attention": label.split(",")[0], "ctx": final["icl_curve"][-1][1], "heldout": heldout,
            "records": [{k: final[k] for k in ("step", "flops", "best_context_loss", "icl_curve", "bayes_curve")
                         if k in final}]}


def _rows_runs(rows: list[dict], keys=("ctx", "model", "docs_per_batch", "reshape_block")) -> list[dict]:
    """Rows of final records (experiments.json, icl_curriculum.json) labelled by attention + what differs."""
    differ = [k for k in keys if len({str(r.get(k)) for r in rows}) > 1]
    return [_entry(r["run"], ", ".join([r["attention"]] + [f"{k}={r.get(k)}" for k in differ]), r,
                   heldout="icl_markov") for r in rows]


def experiment_sweep(name: str, png: str):
    def build(record: dict) -> dict:
        return _compact(f"experiment={name}", "icl_curves", png, _rows_runs(record["experiments"][name]))
    return build


def curriculum_stage2(record: dict) -> dict:
    return _compact("ICL curriculum, stage 2 (ctx 4096)", "icl_curves", "icl_curriculum_icl.png",
                    _rows_runs(record["stage2_ctx4096"]))


def softmax_bump_gap(record: dict) -> dict:
    runs = [_entry(key, f"exp, {key.replace('_', ' ')}", record[key]["stage2_ctx4096"], heldout=key)
            for key in ("disjoint_sizes", "whole_documents")]
    return _compact("Softmax on the ICL curriculum, two variants", "gap_to_optimum", "icl_softmax_bump_gap.png",
                    runs)


def token_shift_gap(record: dict) -> dict:
    runs = []
    for key in ("plain_seed0", "plain_seed1", "token_shift_seed0", "token_shift_seed1"):
        variant, seed = key.rsplit("_seed", 1)
        label = "exp" if variant == "plain" else "exp, arch.token_shift=true"
        runs.append(_entry(key, f"{label}, seed={seed}", record[key]["final"], heldout="icl_markov_long_cpu",
                           seed=int(seed), seed_label=label))
    return _compact("attention=exp with and without the token shift (GPT-2 tiny, CPU)", "gap_to_optimum",
                    "token_shift_cpu_gap.png", runs)


# figure (docs/results/experiments/<name>.png) -> (the record it is drawn from, its compact form)
REPORT_FIGURES = {
    "equal_state_icl": ("experiments", experiment_sweep("attention_equal_state", "equal_state_icl.png")),
    "context_scaling_icl": ("experiments", experiment_sweep("context_scaling", "context_scaling_icl.png")),
    "reshape_icl": ("experiments", experiment_sweep("reshape_ablation", "reshape_icl.png")),
    "icl_vs_batch": ("experiments", experiment_sweep("icl_vs_batch", "icl_vs_batch.png")),
    "icl_vs_params": ("experiments", experiment_sweep("icl_vs_params", "icl_vs_params.png")),
    "icl_curriculum_icl": ("icl_curriculum", curriculum_stage2),
    "icl_softmax_bump_gap": ("icl_softmax_bump", softmax_bump_gap),
    "token_shift_cpu_gap": ("token_shift_cpu", token_shift_gap),
}


def draw_compact(compact: dict, folder: Path) -> dict[str, Path]:
    """Draw a compact report record's figures into `folder` -> {png name: path}."""
    from longctx.report.figures import save
    from longctx.report.record import draw_record

    drawn = draw_record(compact, folder)
    return {compact["figures"][kind]: save(fig, folder / compact["figures"][kind]) for kind, fig in drawn.items()}


PLOTS = {"kernel_benchmark": plot_kernel_benchmark, "bench_train": plot_bench_train,
         "ddp_scaling": plot_ddp_scaling, "wsfr": plot_wsfr, "default_cpu_run": plot_default_cpu_run,
         "bench_decode": plot_bench_decode, "train_paths_loss": plot_train_paths_loss}
# docs/results/experiments/ records drawn from the record itself (the others there are longctx.report's figures)
EXPERIMENT_PLOTS = {"icl_softmax_blind_spot": plot_icl_variant_gaps, "icl_token_shift_attention": plot_icl_variant_gaps}


def main(argv=None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tables", nargs="*", help="which tables or figures (default: every one whose record is in "
                                                  f"--dir; in docs/results: {', '.join(PLOTS)})")
    parser.add_argument("--dir", type=Path, default=RESULTS, help="folder holding <table>.json; PNGs go beside them")
    args = parser.parse_args(argv)
    known = {**PLOTS, **EXPERIMENT_PLOTS}
    compact = sorted(p.stem for p in args.dir.glob("*.json") if _is_compact(p))
    unknown = [t for t in args.tables if t not in known and t not in REPORT_FIGURES and t not in compact]
    if unknown:
        parser.error(f"unknown table {unknown[0]!r}; tables: {', '.join([*known, *REPORT_FIGURES, *compact])}")
    chosen = args.tables or [t for t in [*known, *REPORT_FIGURES, *compact]
                             if (args.dir / f"{REPORT_FIGURES.get(t, (t,))[0]}.json").exists()]
    try:
        written = _draw(chosen, known, compact, args.dir)
    except ValueError as err:  # a compact record naming a figure kind the report does not draw
        parser.exit(2, f"error: {err}\n")
    for path in written:
        print(path)
    return written


def _draw(chosen: list[str], known: dict, compact: list[str], folder: Path) -> list[Path]:
    written = []
    for table in chosen:
        if table in REPORT_FIGURES:
            source, build = REPORT_FIGURES[table]
            written += draw_compact(build(json.loads((folder / f"{source}.json").read_text())), folder).values()
        elif table in compact:
            written += draw_compact(json.loads((folder / f"{table}.json").read_text()), folder).values()
        else:
            record = json.loads((folder / f"{table}.json").read_text())
            written.append(known[table](record, folder / f"{table}.png"))
    return written


def _is_compact(path: Path) -> bool:
    try:
        return json.loads(path.read_text()).get("kind") == "report"
    except (json.JSONDecodeError, AttributeError):
        return False


if __name__ == "__main__":
    main()
