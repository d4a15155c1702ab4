"""Which in-context evidence a trained model can use: its excess loss over the Bayes optimum on the ICL Markov task,
split by what the prefix tells about the current state's row.

    python scripts/icl_recency.py runs/icl/exp/stage2_ctx4096 runs/icl/power_p2/stage2_ctx4096 --out reports/recency
    python scripts/icl_recency.py RUN_DIR --blind 1,2,3 --out reports/recency   # beside the optimum made blind
    python scripts/icl_recency.py --replot reports/recency/recency.json           # redraw a saved table

At every position t in [1, --positions) the current state x_{t-1} falls in one class (longctx.data.icl_markov.
recency_classes): no earlier transition out of it; exactly one, which ended d positions back; or two or more, the
newest d back (d capped at 6). A model that reads all of its context has no excess in any class; one that cannot
read the transitions of its last m tokens loses where those are all it has ("one, ended 1..m back"). `--blind m`
adds that predictor as a reference row (the optimum that never counts the newest m transitions, exact, computed on
the same documents). Only the first --positions tokens are evaluated: the model is causal, so they are what a full
window would give there.

Writes OUT/recency.json (per run: every class's mean excess in nats and its token count) and OUT/recency.png.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import numpy as np
import torch

from longctx.data.icl_markov import bayes_nll_mixture, recency_classes, recency_names
from longctx.eval import per_token_loss
from longctx.plotting import save_figure
from longctx.runs import load_run
from longctx.train.data import build_heldout, resolve_splits

MAX_DIST = 6


def recency_table(tokens: np.ndarray, excess: np.ndarray, positions: int) -> dict:
    """{class name: {"excess": mean nats, "tokens": count}} over positions 1..positions-1 of (n, >= positions)
    documents; classes with no token are left out."""
    cls = recency_classes(tokens[:, :positions], MAX_DIST)[:, 1:]
    ex = excess[:, 1:positions]
    table = {}
    for code, name in enumerate(recency_names(MAX_DIST)):
        hit = cls == code
        if hit.any():
            table[name] = {"excess": round(float(ex[hit].mean()), 4), "tokens": int(hit.sum())}
    return table


def heldout_of(cfg, positions: int, vocab_size: int) -> dict:
    splits = resolve_splits(cfg.data, int(cfg.ctx))  # the run's own documents (their length may follow its ctx)
    return build_heldout(splits, cfg.data, positions, vocab_size)


def model_row(run_dir: str, positions: int, device: str) -> tuple[dict, dict, object]:
    model, cfg = load_run(run_dir, device=device)
    held = heldout_of(cfg, positions, model.spec.vocab_size)
    if held["bayes_nll"] is None:
        raise ValueError(f"{run_dir}: its data has no Bayes-optimal loss (data.name={cfg.data.name}); this analysis "
                         f"needs the ICL Markov task")
    nll = per_token_loss(model, held["inputs"], held["targets"], micro_docs=32)
    excess = nll - held["bayes_nll"].double().numpy()
    row = {"run": str(run_dir), "step": model.checkpoint_step, "attention": model.spec.attention,
           "label": describe(model.spec), "classes": recency_table(held["targets"].numpy(), excess, positions)}
    return row, held, cfg


def describe(spec) -> str:
    """The attention and what sets it apart: parameters, the block it sits in, layers, rotary dims."""
    params = ", ".join(f"{k}={v}" for k, v in spec.attention_params.items() if v not in (None, False))
    rope = "" if spec.rope_dims is None else f", rotary {spec.rope_dims}/{spec.head_dim} dims"
    block = {"gpt2": "GPT-2", "rwkv7": "RWKV7"}[spec.arch] + " block" + (" + token shift" if spec.token_shift else "")
    return f"{spec.attention}{' (' + params + ')' if params else ''}, {block}, {spec.n_layers} layers{rope}"


def blind_rows(held: dict, cfg, blinds: list[int], positions: int) -> list[dict]:
    """The optimum blind to the newest m transitions for each m, on the same documents, as rows of the table."""
    data = cfg.data
    x = held["targets"].numpy()
    optimum = functools.partial(bayes_nll_mixture, x, list(data.get("state_counts") or [data.vocab]), data.alpha,
                                bool(data.get("disjoint_sizes", False)))
    exact = optimum()  # float64, not the stored float32 optimum: blind=0 is exactly 0
    return [{"run": None, "step": None, "attention": "bayes_blind", "blind": m,
             "label": f"optimum blind to its newest {m} transition{'s' * (m > 1)}",
             "classes": recency_table(x, optimum(blind=m) - exact, positions)} for m in blinds]


def plot(rows: list[dict], path: Path, positions: int) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = recency_names(MAX_DIST)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, first, title in ((axes[0], 1, "exactly one earlier transition out of the current state"),
                             (axes[1], 1 + MAX_DIST, "two or more; the newest")):
        for row in rows:
            xs, ys = [], []
            for d in range(1, MAX_DIST + 1):
                cell = row["classes"].get(names[first + d - 1])
                if cell:
                    xs.append(d)
                    ys.append(cell["excess"])
            style = dict(color="black", lw=1, linestyle=(0, (1 + row["blind"], 2))) \
                if row["attention"] == "bayes_blind" else dict(marker="o")  # longer dashes: blind to more
            ax.plot(xs, ys, label=row["label"] + (f" (step {row['step']})" if row.get("step") else ""), **style)
        ax.axhline(0.0, color="black", lw=0.8)
        ax.set_xticks(range(1, MAX_DIST + 1), [str(d) for d in range(1, MAX_DIST)] + [f"{MAX_DIST}+"])
        ax.set_xlabel("it ended this many positions back")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("loss above the Bayes optimum (nats/token)")
    axes[1].legend(fontsize=7, loc="upper right")
    fig.suptitle(f"Excess loss by the newest evidence about the current state's row (positions 1-{positions - 1})",
                 fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", help="run directories (checkpoints/ and config.yaml), ICL Markov task")
    ap.add_argument("--out", type=Path, help="output folder (recency.json, recency.png)")
    ap.add_argument("--positions", type=int, default=64, help="evaluate positions 1..N-1 (default 64)")
    ap.add_argument("--blind", default="", help="comma-separated m: add the optimum blind to its newest m transitions")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument("--replot", type=Path, help="redraw a saved recency.json (beside it) and exit")
    args = ap.parse_args(argv)
    if args.replot is None and (not args.runs or args.out is None):
        ap.error("give run directories and --out, or --replot FILE")
    if args.positions < 2:
        ap.error(f"--positions={args.positions}: must be at least 2")
    try:
        args.blind = [int(m) for m in args.blind.split(",") if m.strip()]
    except ValueError:
        ap.error(f"--blind={args.blind!r}: expected comma-separated non-negative integers, e.g. 1,2,3")
    if any(m < 0 for m in args.blind):
        ap.error(f"--blind={args.blind!r}: expected non-negative integers")
    return args


def main(argv=None) -> Path:
    args = parse_args(argv)
    if args.replot is not None:
        record = json.loads(args.replot.read_text())
        return plot(record["rows"], args.replot.with_suffix(".png"), record["positions"])
    rows, held, cfg = [], None, None
    for run in args.runs:
        row, held_run, cfg_run = model_row(run, args.positions, args.device)
        rows.append(row)
        held, cfg = held or held_run, cfg or cfg_run
        print(f"{run}: " + ", ".join(f"{k} {v['excess']:+.3f}" for k, v in row["classes"].items()), file=sys.stderr)
    rows += blind_rows(held, cfg, args.blind, args.positions)
    args.out.mkdir(parents=True, exist_ok=True)
    record = {"positions": args.positions, "docs": int(held["targets"].shape[0]), "rows": rows}
    (args.out / "recency.json").write_text(json.dumps(record, indent=1) + "\n")
    return plot(rows, args.out / "recency.png", args.positions)


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    print(main())
