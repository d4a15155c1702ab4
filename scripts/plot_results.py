"""Redraw the plots of docs/results/ from their JSON records (no GPU, no training: the numbers are read, not measured).

    python scripts/plot_results.py                     # every <table>.json in docs/results -> <table>.png
    python scripts/plot_results.py --dir out kernel_benchmark
    python scripts/plot_results.py --dir docs/results/experiments   # the experiment figures whose records are here

In docs/results/experiments every record is a compact report record (`python -m longctx.report RUNS --out DIR
--record NAME.json`: a JSON with "kind": "report" and the per-document npz beside it), whose figures longctx.report's
own figure code redraws under the names the record gives them.
Each JSON carries the command that measured it; README.md's "Results" quotes the same records. Figures are written
inside --dir only; a record cut short (JSON or npz) or a --dir that cannot be written is one line and exit 2, before
anything is drawn.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from longctx.plotting import attention_label, save_figure  # noqa: E402
from longctx.train.loggers import plot_icl_curves  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
IMPL_LABELS = {"longctx_p2": "longctx", "retention_1.0.7_p2": "retention 1.0.7",
               "power_attention_1.4.4_p2": "power-attention 1.4.4", "sdpa_cudnn": "SDPA cuDNN (softmax)"}


def _ctx_label(t: int) -> str:
    return f"{t // 1024}k" if t % 1024 == 0 else f"{t:,}"


def _finish(fig, path: Path) -> Path:
    fig.tight_layout()
    return save_figure(fig, path)


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
        line, = ax.plot([r["ctx"] for r in rows], [r["wsfr_no_lm_head"] for r in rows], marker="o",
                        label=attention_label(attention))
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


def plot_train_paths_loss(record: dict, path: Path) -> Path:
    """scripts/compare_train_paths.py's own figure (it draws it too; one drawing for both)."""
    return _script("compare_train_paths").plot_train_paths_loss(record, path)


def draw_compact(compact: dict, folder: Path, name: str | None = None) -> dict[str, Path]:
    """Draw a compact report record's figures into `folder` -> {png name: path} (`name`: the record's file name,
    which keys the paper's claims it tests)."""
    from longctx.report.record import draw_record

    drawn = draw_record(compact, folder, name=name)
    return {compact["figures"][kind]: save_figure(fig, folder / compact["figures"][kind])
            for kind, fig in drawn.items()}


PLOTS = {"kernel_benchmark": plot_kernel_benchmark, "bench_train": plot_bench_train,
         "ddp_scaling": plot_ddp_scaling, "wsfr": plot_wsfr, "default_cpu_run": plot_default_cpu_run,
         "bench_decode": plot_bench_decode, "train_paths_loss": plot_train_paths_loss}


def main(argv=None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tables", nargs="*", help="which tables or figures (default: every one whose record is in "
                                                  f"--dir; in docs/results: {', '.join(PLOTS)})")
    parser.add_argument("--dir", type=Path, default=RESULTS, help="folder holding <table>.json; PNGs go beside them")
    args = parser.parse_args(argv)
    if not args.dir.is_dir():
        parser.exit(2, f"error: --dir {args.dir}: not a folder\n")
    known = dict(PLOTS)
    try:
        records = read_records(args.dir)
    except ValueError as err:
        parser.exit(2, f"error: {err}\n")
    compact = sorted(t for t, record in records.items() if _kind(record) == "report")
    unknown = [t for t in args.tables if t not in known and t not in compact]
    if unknown:
        parser.error(f"unknown table {unknown[0]!r}; tables: {', '.join([*known, *compact])}")
    absent = [t for t in args.tables if t not in records]
    if absent:
        parser.exit(2, f"error: --dir {args.dir} has no {absent[0]}.json (the record {absent[0]!r} is drawn from)\n")
    chosen = args.tables or [t for t in [*known, *compact] if t in records]
    if not chosen:  # a report's --out or a run folder: say so, rather than draw nothing and exit 0
        others = f" ({', '.join(f'{t}.json' for t in sorted(records))}: none is one)" if records else ""
        parser.exit(2, f"error: --dir {args.dir}: no record to draw{others}; records are docs/results' <table>.json "
                       f"and the report records of python -m longctx.report RUNS --out DIR --record FILE.json\n")
    try:
        targets = [args.dir / name for t in chosen for name in figure_names(t, records[t], t in compact)]
        check_writable(targets)
        written = _draw(chosen, known, compact, records, args.dir)
    except ValueError as err:  # a record that cannot be drawn, or a figure that cannot be written: named
        parser.exit(2, f"error: {err}\n")
    for path in written:
        print(path)
    return written


def read_records(folder: Path) -> dict[str, dict]:
    """{table: record} of every <table>.json in `folder`; ValueError naming a file that is not whole JSON (a cut
    record is an error, never skipped)."""
    records = {}
    for path in sorted(folder.glob("*.json")):
        try:
            records[path.stem] = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON ({err.msg}, line {err.lineno}); cut short?") from None
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"{path}: unreadable ({type(err).__name__})") from None
    return records


def _kind(record) -> str | None:
    return record.get("kind") if isinstance(record, dict) else None


def figure_names(table: str, record: dict, compact: bool) -> list[str]:
    """The PNG names a table draws; a compact record's must be plain names (the figures go inside --dir only)."""
    if not compact:
        return [f"{table}.png"]
    figs = record.get("figures")
    if not isinstance(figs, dict):
        raise ValueError(f"{table}.json: no 'figures' table naming the PNGs to draw")
    for name in figs.values():
        if not (isinstance(name, str) and name.endswith(".png") and Path(name).name == name
                and name not in (".png", "..png")):
            raise ValueError(f"{table}.json: figure name {name!r} is not a .png file name in --dir; "
                             f"figures are drawn inside --dir only")
    return list(figs.values())


def check_writable(paths: list[Path]) -> None:
    """ValueError naming the first figure that cannot be written, before any is drawn."""
    for path in paths:
        if path.exists() and not os.access(path, os.W_OK):
            raise ValueError(f"{path}: is read-only; nothing drawn")
        if not path.exists() and not os.access(path.parent, os.W_OK | os.X_OK):
            raise ValueError(f"{path.parent}: not writable; nothing drawn")


def _draw(chosen: list[str], known: dict, compact: list[str], records: dict, folder: Path) -> list[Path]:
    written = []
    for table in chosen:
        try:
            if table in compact:
                written += draw_compact(records[table], folder, table).values()
            else:
                written.append(known[table](records[table], folder / f"{table}.png"))
        except (KeyError, TypeError, IndexError) as err:  # a field missing or of the wrong kind
            raise ValueError(f"{folder / f'{table}.json'}: not a complete {table} record "
                             f"({type(err).__name__}: {err})") from None
    return written


def _is_compact(path: Path) -> bool:
    try:
        return _kind(json.loads(path.read_text())) == "report"
    except json.JSONDecodeError:
        return False


if __name__ == "__main__":
    main()
