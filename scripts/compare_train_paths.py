"""Same losses on the fast path: train the same model on the same batches with the recipe's settings
(trainer.compile=blocks, activation checkpointing auto) and with the eager path (no compile, checkpointing on), and
the eager path again from another seed for the run-to-run noise; every step's training loss, then the comparison.

    python scripts/compare_train_paths.py                        # GPT-2 small, power p=2, ctx 8192, 200 steps
    python scripts/compare_train_paths.py --steps 20 --overrides "model=tiny device=cpu" --ctx 256   # CPU smoke

Data: the calibrated ICL task (data=icl_markov_long, documents of --ctx tokens), so the loss falls and the
curves say something. Writes <out>/train_paths_loss.json (the per-step losses of the three runs and the summary)
and <out>/train_paths_loss.png.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

from longctx.plotting import save_figure  # noqa: E402
from longctx.train.console import close_logging  # noqa: E402
from longctx.train.launch import check_overrides  # noqa: E402
from longctx.train.trainer import Trainer  # noqa: E402

CONF = Path(__file__).resolve().parent.parent / "conf"
RUNS = {  # name -> (overrides, seed)
    "fast (compile=blocks, checkpointing auto)": ("trainer.compile=blocks trainer.activation_checkpointing=auto", 0),
    "eager (checkpointing on)": ("trainer.compile=false trainer.activation_checkpointing=true", 0),
    "eager, seed 1": ("trainer.compile=false trainer.activation_checkpointing=true", 1),
}


def train_losses(overrides: list[str], steps: int) -> list[float]:
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        cfg = compose("config", overrides=overrides)
    trainer = Trainer(cfg)
    try:
        batches = [batch for _, batch in zip(range(steps), trainer.reader)]
        if cfg.trainer.activation_checkpointing == "auto":  # as the trainer: probe on the first batch, then train on it
            trainer.choose_checkpointing(batches[0])
        return [trainer.train_step(batch) for batch in batches]
    finally:
        trainer.reader.close()
        close_logging()
        del trainer
        gc.collect()
        torch._dynamo.reset()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def finished_runs(path: Path, record: dict, steps: int) -> dict[str, list[float]]:
    """The complete runs of an earlier comparison, provided it had the same device and train.py overrides (the
    scratch data folder aside) and the same steps: losses from another setting would not compare."""
    if not path.is_file():
        raise SystemExit(f"--continue-from {path}: no such file")
    earlier = json.loads(path.read_text())
    settings = lambda rec: {"device": rec.get("device"),  # noqa: E731
                            "overrides": [o for o in rec.get("overrides") or [] if not o.startswith("data.cache_dir=")]}
    mine, theirs = settings(record), settings(earlier)
    for field in mine:
        if mine[field] != theirs[field]:
            raise SystemExit(f"--continue-from {path}: its {field} {theirs[field]!r} differs from this run's "
                             f"{mine[field]!r}")
    return {k: v for k, v in earlier.get("losses", {}).items() if k in RUNS and len(v) == steps}


def summarize(losses: dict[str, list[float]], tail: int) -> dict:
    """Mean loss of the last `tail` steps of each run; the fast path's distance to the eager run against the
    distance between the two eager seeds (the noise)."""
    (fast, a), (eager, b), (_, c) = [(k, np.asarray(v)) for k, v in losses.items()]
    return {"tail_steps": tail, "tail_mean": {k: round(float(np.mean(v[-tail:])), 4) for k, v in losses.items()},
            "fast_vs_eager": round(float(np.mean(np.abs(a[-tail:] - b[-tail:]))), 4),
            "seed_vs_seed": round(float(np.mean(np.abs(c[-tail:] - b[-tail:]))), 4)}


def plot_train_paths_loss(record: dict, path: Path) -> Path:
    """Training loss per step of each run (raw, faint; 10-step mean, solid)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.4))
    for (name, losses), colour in zip(record["losses"].items(), ("C0", "C1", "C2")):
        steps = range(1, len(losses) + 1)
        ax.plot(steps, losses, color=colour, alpha=0.25, lw=0.8)
        k = min(10, len(losses))
        smooth = [sum(losses[max(0, i - k + 1):i + 1]) / len(losses[max(0, i - k + 1):i + 1]) for i in range(len(losses))]
        ax.plot(steps, smooth, color=colour, lw=1.6, label=name, ls="--" if "seed 1" in name else "-")
    s = record["summary"]
    ax.set(xlabel="optimizer step", ylabel="training loss (nats/token)",
           title=f"Same batches, fast vs eager path ({record['device']}): last {s['tail_steps']} steps "
                 f"|fast - eager| {s['fast_vs_eager']:.4f}, |seed 1 - seed 0| {s['seed_vs_seed']:.4f}")
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--docs", type=int, default=8, help="documents per step (one per micro-batch)")
    ap.add_argument("--overrides", default="arch=gpt2 attention=power p=2", help="train.py overrides for all runs")
    ap.add_argument("--out", default=os.environ.get("OUT", "compare_out"))
    ap.add_argument("--continue-from", type=Path, metavar="JSON",
                    help="a train_paths_loss.json of a stopped comparison with the same settings: its finished runs "
                         "are kept, the others trained")
    args = ap.parse_args(argv)
    try:  # a mistyped train.py key or option: named as train.py names it, before anything is made
        check_overrides(shlex.split(args.overrides), CONF)
    except ValueError as err:
        print(f"error: --overrides: {err}", file=sys.stderr)
        sys.exit(2)
    scratch = Path(tempfile.mkdtemp(prefix="train_paths_"))
    base = ["experiment=paper", "data=icl_markov_long", f"ctx={args.ctx}", f"data.doc_len={args.ctx}",
            f"data.train_tokens={(args.steps + 2) * args.docs * args.ctx}", "data.n_heldout=2", "data.eval_docs=2",
            f"data.cache_dir={scratch / 'data'}", f"data.docs_per_batch={args.docs}", "trainer.micro_docs=1",
            "optim.lr=1e-3", f"optim.warmup_steps={min(20, args.steps)}", f"trainer.max_steps={args.steps}",
            "logger.wandb.mode=disabled",
            *shlex.split(args.overrides)]
    losses = {}
    os.makedirs(args.out, exist_ok=True)
    record = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "command": "python " + " ".join(map(shlex.quote, sys.argv)), "overrides": base}
    if args.continue_from:
        losses = finished_runs(args.continue_from, record, args.steps)
    for i, (name, (extra, seed)) in enumerate(RUNS.items()):
        if name in losses:
            print(f"{name}: kept from {args.continue_from}", flush=True)
            continue
        losses[name] = train_losses(base + shlex.split(extra) + [f"seed={seed}", f"run_dir={scratch / str(i)}"],
                                    args.steps)
        print(f"{name}: first {losses[name][0]:.4f}, last {losses[name][-1]:.4f}", flush=True)
        record["losses"] = {k: [round(x, 5) for x in v] for k, v in losses.items()}
        if len(losses) == len(RUNS):
            record["summary"] = summarize(losses, tail=max(1, args.steps // 4))
        Path(args.out, "train_paths_loss.json").write_text(json.dumps(record, indent=1) + "\n")  # kept run by run
    print(json.dumps(record["summary"], indent=1))
    plot_train_paths_loss(record, Path(args.out, "train_paths_loss.png"))


if __name__ == "__main__":
    main()
