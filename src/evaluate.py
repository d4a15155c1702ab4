"""Evaluate a trained run at any context length and on any data: the paper's long-context metrics.

    python -m longctx.evaluate RUN_DIR --ctx 2048 --out eval_2048.json
    python -m longctx.evaluate RUN_DIR --ctx 65536 data=longcrawl64 data.path=/data/lc64 --docs 16 --out lc64.json

Writes FILE.json (the per-position heldout loss, the binned ICL curve, best-context loss, last-10% loss, and the
Bayes-optimal curve where the data has one) and FILE.png beside it (the ICL curve). Data overrides are the
trainer's: `data=NAME` swaps the data config (conf/data/NAME.yaml), `data.KEY=VALUE` changes one key of it;
without them the run's own data is used. The heldout documents come from the trainer's own builders
(train/data.py), the metrics from train/metrics.py. Bad input gives one line `error: ...` and exit code 2.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from longctx.data import check_vocab
from longctx.runs import load_run
from longctx.train.data import build_heldout, resolve_splits
from longctx.train.loggers import plot_icl_curves
from longctx.train.metrics import icl_summary

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def apply_data_overrides(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """`data=NAME` (conf/data/NAME.yaml) and `data.KEY=VALUE` applied to the run's config, in order."""
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not (key == "data" or key.startswith("data.")):
            raise ValueError(f"{item!r}: expected a data override, data=NAME or data.KEY=VALUE")
        if key == "data":
            path = CONF_DIR / "data" / f"{value}.yaml"
            if not path.exists():
                known = sorted(p.stem for p in (CONF_DIR / "data").glob("*.yaml"))
                raise ValueError(f"data={value}: no such data config; known: {', '.join(known)}")
            cfg.data = OmegaConf.load(path)
            OmegaConf.resolve(cfg)  # e.g. cache_dir: ${cache_dir} from the run's config
            continue
        name = key[len("data."):]
        if name not in cfg.data:
            raise ValueError(f"{key}: not a key of the {cfg.data.name} data config "
                             f"(keys: {', '.join(str(k) for k in cfg.data)})")
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([item]))
    return cfg


def autocast(device: torch.device, precision: str):
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def _nll_batches(model, inputs: torch.Tensor, targets: torch.Tensor, micro_docs: int, precision: str):
    """The next-token NLL of `micro_docs` documents of inputs/targets (n, T) at a time: (m, T) float64 on the CPU."""
    device = next(model.parameters()).device
    for s in range(0, inputs.shape[0], micro_docs):
        with autocast(device, precision):
            nll = model(inputs[s:s + micro_docs].to(device), targets[s:s + micro_docs].to(device))
        yield nll.double().cpu()


def per_token_loss(model, inputs: torch.Tensor, targets: torch.Tensor, micro_docs: int,
                   precision: str = "auto") -> np.ndarray:
    """Next-token NLL of every token of inputs/targets (n, T) -> (n, T) float64, `micro_docs` documents a forward."""
    return torch.cat(list(_nll_batches(model, inputs, targets, micro_docs, precision))).numpy()


def per_position_loss(model, inputs: torch.Tensor, targets: torch.Tensor, micro_docs: int,
                      precision: str = "auto") -> np.ndarray:
    """Mean next-token NLL at each position over the documents (rows) of inputs/targets (n, T) -> (T,) float64.
    Summed batch by batch: a long context never holds every token's loss."""
    total = sum(nll.sum(0) for nll in _nll_batches(model, inputs, targets, micro_docs, precision))
    return (total / inputs.shape[0]).numpy()


def evaluate(run_dir: str | Path, ctx: int, out: str | Path, data_overrides: list[str] = (), docs: int | None = None,
             step: int | None = None, bins: int | None = None, micro_docs: int | None = None,
             device: str = "auto", precision: str = "auto") -> dict:
    """Evaluate the run's checkpoint at context `ctx`; writes `out` (JSON) and the plot beside it. Returns the record."""
    if isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 2:
        raise ValueError(f"--ctx={ctx!r}: must be an integer >= 2")
    if docs is not None and docs < 1:
        raise ValueError(f"--docs={docs}: must be a positive integer")
    model, run_cfg = load_run(run_dir, step=step, device=device)
    cfg = apply_data_overrides(run_cfg, list(data_overrides))
    if docs is not None:
        cfg.data.eval_docs = docs
    splits = resolve_splits(cfg.data, ctx)  # refuses ctx longer than the documents
    vocab = model.spec.vocab_size
    if splits.info["vocab_size"] > vocab:
        raise ValueError(f"data vocabulary {splits.info['vocab_size']} ({splits.heldout_path}) does not fit the "
                         f"model's vocabulary {vocab}: the run was trained on other data")
    heldout = build_heldout(splits, cfg.data, ctx, vocab)
    start = time.time()
    curve = per_position_loss(model, heldout["inputs"], heldout["targets"],
                              micro_docs or cfg.trainer.micro_docs or cfg.data.docs_per_batch, precision)
    bayes = heldout["bayes_nll"].double().mean(0).numpy() if heldout.get("bayes_nll") is not None else None
    record = {
        "run_dir": str(run_dir), "checkpoint": str(model.checkpoint_path), "step": model.checkpoint_step,
        "ctx": ctx, "train_ctx": int(run_cfg.ctx), "docs": int(heldout["inputs"].shape[0]),
        "data": {"name": cfg.data.name, "heldout": str(splits.heldout_path)},
        "arch": model.spec.arch, "attention": model.spec.attention, "attention_params": model.spec.attention_params,
        "seconds": round(time.time() - start, 2),
    }
    record.update(icl_summary(curve, bins or cfg.trainer.icl_bins, bayes))
    record["per_position_loss"] = [round(float(x), 5) for x in curve]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    title = (f"{Path(run_dir).name}: step {record['step']} evaluated at ctx {ctx} "
             f"(trained at {record['train_ctx']}), {cfg.data.name}")
    record["plot"] = str(plot_icl_curves([record], out.with_suffix(".png"), title))
    return record


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m longctx.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="the run's directory (checkpoints/, config.yaml)")
    parser.add_argument("overrides", nargs="*", help="data overrides: data=NAME, data.KEY=VALUE")
    parser.add_argument("--ctx", type=int, required=True, help="context length to evaluate at (tokens)")
    parser.add_argument("--out", required=True, help="the JSON to write; the plot goes beside it (.png)")
    parser.add_argument("--docs", type=int, help="heldout documents (default: the data config's eval_docs)")
    parser.add_argument("--step", type=int, help="checkpoint step (default: the newest)")
    parser.add_argument("--bins", type=int, help="ICL curve bins (default: the run's trainer.icl_bins)")
    parser.add_argument("--micro-docs", type=int, help="documents per forward (default: the run's)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    parser.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"),
                        help="auto: bf16 autocast on CUDA, fp32 on CPU")
    return parser.parse_intermixed_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        rec = evaluate(args.run_dir, args.ctx, args.out, args.overrides, docs=args.docs, step=args.step,
                       bins=args.bins, micro_docs=args.micro_docs, device=args.device, precision=args.precision)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)  # bad input: one line naming what is wrong, no traceback
        return 2
    line = (f"step {rec['step']} at ctx {rec['ctx']} (trained at {rec['train_ctx']}), {rec['docs']} docs: "
            f"best-context loss {rec['best_context_loss']:.4f} (bin {rec['best_context_bin']}), "
            f"last-10% loss {rec['last10_loss']:.4f}")
    if "bayes_curve" in rec:
        line += (f"; Bayes-optimal best-context {rec['bayes_best_context_loss']:.4f}, gap {rec['best_context_gap']:+.4f}"
                 f", largest gap over the curve {rec['max_bin_gap']:+.4f}")
    print(line)
    print(f"wrote {args.out} and {rec['plot']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
