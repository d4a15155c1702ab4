"""Training-step benchmark: tokens/s, peak memory and MFU of full steps (forward + backward + AdamW) for every
arch x attention x context, tokens per update fixed (batch x ctx constant), bf16 autocast, one GPU.

    python scripts/bench_train.py                                  # GPT-2 small and RWKV7 small, all pairs
    python scripts/bench_train.py --archs gpt2 --attentions exp power --ctx 1024 65536 --steps 5

Writes <out>/bench_train.jsonl (one object per run), <out>/bench_train.md (table) and <out>/bench_train.png.
MFU = 3 x model forward FLOPs per token (model.flops_per_token: weight + state, docs/models.md) x tokens/s over
the card's dense bf16 peak, looked up by device name (longctx.train.flops, shared with the trainer). A run that
fails (e.g. out of memory) is recorded with its error and the sweep goes on.
"""
from __future__ import annotations

import argparse
import json
import os
import time
import traceback
from pathlib import Path

# FLA's first-call config benchmarks stay on disk: a rerun on this machine skips them (as train.py does)
os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")

import torch  # noqa: E402

from omegaconf import OmegaConf  # noqa: E402

from longctx.models import ModelSpec, build_model  # noqa: E402
from longctx.train.flops import TRAIN_FLOPS_FACTOR, peak_bf16_flops  # noqa: E402

SIZES_DIR = Path(__file__).resolve().parent.parent / "conf" / "model"  # the sizes train.py uses (model=...)
LABELS = {"exp": "exp", "window": "window-{window}", "linear": "linear", "power": "power p={p}",
          "none": "no mixing"}


class NoMixing(torch.nn.Module):
    """Benchmark-only attention core (--attentions none): each position keeps its own value, no token mixing and no
    cost. A model with it runs every other part of the step (projections, MLP or channel mix, gates, loss head,
    optimizer), so its tokens/s is the ceiling any attention can reach in that model (docs/models.md, "Training
    speed")."""

    def forward(self, q, k, v, x=None):
        return v

    def state_size(self, ctx):
        return 0

    def state_flops(self, ctx):
        return 0


def _no_mixing(model):
    """Swap every attention core of a model built with attention=exp for NoMixing."""
    for module in model.modules():
        if hasattr(module, "core"):
            module.core = NoMixing()
    return model


def model_size(name):
    size = OmegaConf.load(SIZES_DIR / f"{name}.yaml")
    return dict(d_model=size.d_model, n_layers=size.n_layers, n_heads=size.n_heads, mlp_ratio=size.mlp_ratio)


def bench_one(arch, attention, ctx, args):
    spec = ModelSpec.from_dict(dict(  # p and window go to the attention that takes them
        arch=arch, attention="exp" if attention == "none" else attention, vocab_size=args.vocab, ctx=ctx,
        p=args.p, window=args.window, checkpoint_activations=args.checkpoint, **model_size(args.size)))
    batch = max(1, args.tokens // ctx)
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    torch.manual_seed(0)
    with dev:
        model = build_model(spec)
    if attention == "none":
        model = _no_mixing(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.999), weight_decay=0.1, fused=cuda)
    if args.compile:  # each run compiles afresh, as train.py's one model per process does
        torch._dynamo.reset()
    fwd = torch.compile(model) if args.compile else model   # trainer.compile=true (warm-up absorbs compilation)
    x = torch.randint(0, args.vocab, (batch, ctx), device=dev)
    y = torch.roll(x, -1, 1)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def step():
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = fwd(x, y).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup):  # compiles, autotunes, allocator warm-up
        loss = step()
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    sync()
    dt = (time.perf_counter() - t0) / args.steps
    if args.profile and cuda:
        print_profile(step, f"{arch} {attention} ctx {ctx}")
    tokens_per_s = batch * ctx / dt
    fl = model.flops_per_token(ctx)
    peak = peak_bf16_flops(torch.cuda.get_device_name()) if cuda else None
    flops_per_token = TRAIN_FLOPS_FACTOR * (fl["weight"] + fl["state"])
    return dict(
        arch=arch, attention=attention, label=LABELS[attention].format(window=args.window, p=args.p), ctx=ctx,
        batch=batch, step_s=dt, tokens_per_s=tokens_per_s,
        peak_mem_gib=torch.cuda.max_memory_allocated() / 2 ** 30 if cuda else 0.0,
        mfu=(flops_per_token * tokens_per_s / peak) if peak else None, train_flops_per_token=flops_per_token,
        wsfr=fl["weight"] / max(fl["state"], 1.0), state_size=model.state_size(ctx),
        params=sum(p.numel() for p in model.parameters()), loss=float(loss), compiled=args.compile, error=None,
    )


def print_profile(step, title, rows=25):
    """CUDA time per kernel of one more step (torch.profiler), the largest first: where a step's time goes."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    print(f"PROFILE {title}", flush=True)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=70), flush=True)


def write_table(rows, path, device):
    lines = [f"Device: {device}; torch {torch.__version__}; tokens per update fixed; bf16 autocast; "
             "fwd+bwd+AdamW.", "",
             "| arch | attention | ctx | batch | tokens/s | step (ms) | peak mem (GiB) | MFU | WSFR |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["error"]:
            lines.append(f"| {r['arch']} | {r['label']} | {r['ctx']} | {r['batch']} | failed: {r['error'][:60]} "
                         "| | | | |")
            continue
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        lines.append(f"| {r['arch']} | {r['label']} | {r['ctx']} | {r['batch']} | {r['tokens_per_s']:,.0f} | "
                     f"{1e3 * r['step_s']:.1f} | {r['peak_mem_gib']:.1f} | {mfu} | {r['wsfr']:.2g} |")
    lines += ["", *ratios(rows)]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return "\n".join(lines)


def ratios(rows):
    """The issue's targets: power p=2 at the longest ctx vs exp at the shortest (>= 0.8x) and at the longest (>= 5x)."""
    ok = {(r["arch"], r["attention"], r["ctx"]): r["tokens_per_s"] for r in rows if not r["error"]}
    out = []
    for arch in sorted({r["arch"] for r in rows}):
        ctxs = sorted({c for (a, _, c) in ok if a == arch})
        if not ctxs:
            continue
        lo, hi = ctxs[0], ctxs[-1]
        pw, e_lo, e_hi = ok.get((arch, "power", hi)), ok.get((arch, "exp", lo)), ok.get((arch, "exp", hi))
        if pw and e_lo:
            out.append(f"- {arch}: power@{hi} / exp@{lo} tokens/s = {pw / e_lo:.2f}x (target >= 0.8x)")
        if pw and e_hi:
            out.append(f"- {arch}: power@{hi} / exp@{hi} tokens/s = {pw / e_hi:.2f}x (target >= 5x)")
        ceil = ok.get((arch, "none", hi))
        if ceil and e_hi:
            out.append(f"- {arch}: with no attention cost at all (no mixing@{hi}) / exp@{hi} = {ceil / e_hi:.2f}x: "
                       "the most any attention can reach")
    return out


def plot(rows, path, device):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    archs = sorted({r["arch"] for r in rows})
    fig, axes = plt.subplots(1, len(archs), figsize=(6 * len(archs), 4.5), squeeze=False)
    for ax, arch in zip(axes[0], archs):
        for label in dict.fromkeys(r["label"] for r in rows if r["arch"] == arch):
            pts = sorted((r["ctx"], r["tokens_per_s"]) for r in rows
                         if r["arch"] == arch and r["label"] == label and not r["error"])
            if pts:
                ax.plot(*zip(*pts), marker="o", label=label)
        ax.set(xscale="log", yscale="log", xlabel="context length", ylabel="training tokens/s",
               title=f"{arch} ({device})")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archs", nargs="+", default=["gpt2", "rwkv7"])
    ap.add_argument("--attentions", nargs="+", default=["exp", "window", "linear", "power"])
    ap.add_argument("--ctx", nargs="+", type=int, default=[1024, 8192, 65536])
    ap.add_argument("--tokens", type=int, default=65536, help="tokens per update (batch = tokens // ctx)")
    ap.add_argument("--size", default="small", choices=sorted(f.stem for f in SIZES_DIR.glob("*.yaml")))
    ap.add_argument("--p", type=int, default=2)
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (trainer.compile=true)")
    ap.add_argument("--profile", action="store_true", help="print the CUDA time per kernel of one extra step")
    ap.add_argument("--checkpoint", action="store_true", help="activation checkpointing")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    ap.add_argument("--device", default="cuda", help="cuda (the benchmark) or cpu (a smoke test at --size tiny)")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_train.py: no CUDA device (use --device cpu --size tiny for a smoke test)")
    os.makedirs(args.out, exist_ok=True)
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    rows = []
    jsonl = os.path.join(args.out, "bench_train.jsonl")
    with open(jsonl, "w") as f:
        for arch in args.archs:
            for attention in args.attentions:
                for ctx in args.ctx:
                    try:
                        row = bench_one(arch, attention, ctx, args)
                    except Exception as e:  # recorded, not hidden: the table shows the failure
                        traceback.print_exc()
                        row = dict(arch=arch, attention=attention, ctx=ctx, batch=max(1, args.tokens // ctx),
                                   label=LABELS[attention].format(window=args.window, p=args.p),
                                   error=f"{type(e).__name__}: {e}".splitlines()[0])
                    if args.device == "cuda":
                        torch.cuda.empty_cache()
                    row["device"] = device
                    rows.append(row)
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    msg = row["error"] or (f"{row['tokens_per_s']:,.0f} tok/s  {row['peak_mem_gib']:.1f} GiB  "
                                           f"MFU {100 * (row['mfu'] or 0):.1f}%")
                    print(f"{arch:6s} {row['label']:12s} ctx {ctx:6d} x {row['batch']:3d}: {msg}", flush=True)
    print(write_table(rows, os.path.join(args.out, "bench_train.md"), device))
    plot(rows, os.path.join(args.out, "bench_train.png"), device)


if __name__ == "__main__":
    main()
