"""Training speed through the trainer itself: tokens/s, MFU and peak memory of `python train.py experiment=paper`
steps (the model, optimizer, data reader, precision, checkpointing and compile settings train.py uses), every row
in one process, one GPU.

    python scripts/bench_train.py                                   # gpt2 and rwkv7 x the four rows below
    python scripts/bench_train.py --archs gpt2 --variant eager="trainer.compile=false trainer.activation_checkpointing=true"

Rows per arch: exp@1024 (64 docs of 1k per micro-batch), exp@65536, power p=2@65536 and none@65536, the no-mixing
ceiling: every attention core replaced by a pass-through (each position keeps its value), so the step runs
everything else (projections, MLP or channel mix, gates, loss head, optimizer, data) and its tokens/s bounds what
any attention can reach in that model. Each `--variant NAME="overrides"` reruns every row with those train.py
overrides on top of the recipe (default: one variant, the recipe as configured); an item `kernel:FIELD=VALUE` sets a
power-kernel switch (kernels.power.switches: `kernel:concurrent_bwd=0`, `kernel:dispatch.chunk_p2=256`) for that
variant's rows, so a switch is A/B'd in whole training steps in one process.

Data: random GPT-2-vocabulary tokens written once in the LongCrawl64 layout (speed does not depend on the values).
Timing: `--warmup` steps (compilation, autotuning, the checkpointing probe), then at least `--steps` steps and
`--min-seconds` of them, each the trainer's own `train_step` on the reader's next batch, synchronized; the time spent
waiting for the reader is reported per step (`data_wait_s`, 0 when the read-ahead keeps up). MFU counts 3x the
model's forward FLOPs per token in the form that runs (longctx.train.flops); recomputation by activation
checkpointing is not counted.
`--variant cpu="model=tiny device=cpu" --rows exp@128 --tokens 512` is a CPU smoke test.
Writes <out>/bench_train.json ({"device", "rows": [...]}) and <out>/bench_train.md; a failed row (e.g. out of
memory) is recorded with its error and the sweep goes on.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")  # as train.py: FLA's config benchmarks stay on disk

import numpy as np  # noqa: E402
import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

from longctx.data.prepare import PrepareConfig  # noqa: E402
from longctx.kernels.power import switches  # noqa: E402
from longctx.train.console import close_logging  # noqa: E402
from longctx.train.flops import flops_report, mfu  # noqa: E402
from longctx.train.launch import check_overrides  # noqa: E402
from longctx.train.trainer import Trainer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

CONF = ROOT / "conf"
KERNEL = "kernel:"
ROWS = [("exp", 1024), ("exp", 65536), ("power", 65536), ("none", 65536)]


class NoMixing(torch.nn.Module):
    """Benchmark-only attention core: each position keeps its own value; no mixing, no cost."""

    def forward(self, q, k, v, x=None):
        return v

    def state_size(self, ctx):
        return 0

    def state_flops(self, ctx):
        return 0

    def forward_flops(self, ctx, device_type="cuda", dtype=None):
        return 0.0


def write_random_dataset(root: Path, doc_len: int, n_train: int, n_heldout: int, vocab: int = 50257) -> Path:
    """A LongCrawl64-layout folder (train.zarr, heldout.zarr) of uniform random token ids, in the chunks
    scripts/prepare_dataset.py writes, LongCrawl64's 2048 documents x 2048 positions (a chunk as long as a document
    would make a 1k-token batch decode 64 times the tokens it uses: the reader, not the model, would set the 1k
    rows' speed)."""
    import zarr
    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("heldout", n_heldout)):
        arr = zarr.create_array(str(root / f"{split}.zarr"), shape=(n, doc_len),
                                chunks=(min(PrepareConfig.chunk_docs, n), min(PrepareConfig.chunk_len, doc_len)),
                                dtype="uint16", attributes={"vocab_size": vocab, "bos_id": vocab - 1,
                                                            "max_token_id": vocab - 1})
        arr[:] = rng.integers(0, vocab, size=(n, doc_len), dtype=np.uint16)
    return root


def compose_cfg(arch: str, attention: str, ctx: int, docs: int, tokens: int, data: Path, run_dir: Path,
                extra: list[str], steps: int):
    """The recipe's config for one row: micro-batches of `tokens` tokens (exp@1024: 64 documents), `docs` of them
    per step, `steps` steps (warmup and timed: what the trainer's start-up estimate then counts; the row calls
    train_step itself, so the steps --min-seconds adds run past it on the schedule's flat tail). The recipe's warmup
    is fitted to so short a run: the steps train at the recipe's learning rate, so a row's loss is one of real
    training steps, not comparable with records whose steps sat at the start of a long warmup."""
    micro = max(1, tokens // ctx)
    overrides = ["experiment=paper", f"arch={arch}", f"attention={'exp' if attention == 'none' else attention}",
                 f"ctx={ctx}", f"data.path={data}", f"data.docs_per_batch={docs * micro}", "data.eval_docs=1",
                 f"trainer.micro_docs={micro}", "logger.wandb.mode=disabled", f"run_dir={run_dir}",
                 f"trainer.max_steps={steps}", *extra]
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        cfg = compose("config", overrides=overrides)
    return cfg


def split_kernel_switches(extra: list[str]) -> tuple[list[str], list[str]]:
    """A variant's items -> (train.py overrides, kernel switches FIELD=VALUE without the `kernel:` prefix)."""
    return ([x for x in extra if not x.startswith(KERNEL)],
            [x[len(KERNEL):] for x in extra if x.startswith(KERNEL)])


def bench_row(arch, attention, ctx, variant, extra, args, data, scratch) -> dict:
    overrides, kernel = split_kernel_switches(extra)
    with switches.applied(kernel):         # process-wide while the row runs, restored after it
        return _bench_row(arch, attention, ctx, variant, extra, overrides, args, data, scratch)


def _bench_row(arch, attention, ctx, variant, extra, overrides, args, data, scratch) -> dict:
    run_dir = scratch / f"{arch}_{attention}_{ctx}_{variant}"
    cfg = compose_cfg(arch, attention, ctx, args.docs, args.tokens, data, run_dir, overrides,
                      args.warmup + args.steps)
    trainer = Trainer(cfg)
    cuda = trainer.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    try:
        if attention == "none":
            for module in trainer.model.modules():
                if hasattr(module, "core"):
                    module.core = NoMixing()
            trainer.flops = flops_report(trainer.model, ctx)
        batches = iter(trainer.reader)
        if cfg.trainer.activation_checkpointing == "auto":
            trainer.choose_checkpointing(next(batches))
        for _ in range(args.warmup):
            loss = trainer.train_step(next(batches))
        sync()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        tokens = steps = 0
        data_wait = 0.0
        while steps < args.steps or time.perf_counter() - t0 < args.min_seconds:
            t_data = time.perf_counter()
            batch = next(batches)
            data_wait += time.perf_counter() - t_data  # the reader's share: > 0 only when it falls behind
            loss = trainer.train_step(batch)
            tokens += batch["targets"].numel()
            steps += 1  # train_step returns the loss as a float: each step ends synchronized
        sync()
        dt = time.perf_counter() - t0
        tokens_per_s = tokens / dt
        if cuda and f"{attention}@{ctx}" in args.profile:
            print_profile(lambda: trainer.train_step(next(batches)), f"{arch} {attention}@{ctx} [{variant}]")
        util = mfu(tokens_per_s, trainer.flops["train_flops_per_token"], trainer.device_name)
        return dict(arch=arch, attention=attention, ctx=ctx, variant=variant, overrides=" ".join(extra),
                    tokens_per_s=round(tokens_per_s), step_s=round(dt / steps, 4), steps_timed=steps,
                    data_wait_s=round(data_wait / steps, 4),
                    mfu=None if util is None else round(util, 4),
                    peak_gb=round(torch.cuda.max_memory_allocated() / 1e9, 2) if cuda else None,
                    checkpointing=trainer.model.spec.checkpoint_activations, compile=str(cfg.trainer.compile),
                    docs_per_step=cfg.data.docs_per_batch, micro_docs=cfg.trainer.micro_docs, loss=round(loss, 4),
                    train_flops_per_token=trainer.flops["train_flops_per_token"], error=None)
    finally:
        trainer.reader.close()
        close_logging()
        del trainer
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        torch._dynamo.reset()


def print_profile(step, title, rows=40):
    """CUDA time per kernel of one more step (torch.profiler), the largest first: where a step's time goes."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    print(f"PROFILE {title}", flush=True)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=60), flush=True)


def write_table(rows, path, device):
    lines = [f"Device: {device}; torch {torch.__version__}; `python train.py experiment=paper` steps "
             f"(bf16, AdamW, the trainer's data reader); MFU excludes recomputation.", "",
             "| arch | attention | ctx | variant | tokens/s | MFU | peak GB | checkpointing | compile |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        head = f"| {r['arch']} | {r['attention']} | {r['ctx']} | {r['variant']} |"
        if r["error"]:
            lines.append(f"{head} failed: {r['error'][:70]} | | | | |")
        else:
            lines.append(f"{head} {r['tokens_per_s']:,} | {pct(r['mfu'])} | {num(r['peak_gb'])} | "
                         f"{'on' if r['checkpointing'] else 'off'} | {r['compile']} |")
    lines += ["", *ratios(rows)]
    Path(path).write_text("\n".join(lines) + "\n")
    return "\n".join(lines)


def pct(x):
    return "n/a" if x is None else f"{100 * x:.1f}%"


def num(x):
    return "n/a" if x is None else f"{x:.1f}"


def ratios(rows):
    """The targets: power@64k against the no-mixing ceiling of the same variant, and against exp@1024 and exp@64k."""
    ok = {(r["arch"], r["attention"], r["ctx"], r["variant"]): r["tokens_per_s"] for r in rows if not r["error"]}
    out = []
    for arch, _, _, variant in sorted({(a, None, None, v) for a, _, _, v in ok}):
        get = lambda att, ctx: ok.get((arch, att, ctx, variant))  # noqa: E731
        pw, ceil, e1k, e64k = get("power", 65536), get("none", 65536), get("exp", 1024), get("exp", 65536)
        if pw and ceil:
            out.append(f"- {arch} [{variant}]: power@65536 / no-mixing ceiling = {pw / ceil:.2f}")
        if pw and e64k:
            out.append(f"- {arch} [{variant}]: power@65536 / exp@65536 = {pw / e64k:.2f}x")
        if pw and e1k:
            out.append(f"- {arch} [{variant}]: power@65536 / exp@1024 = {pw / e1k:.2f}x")
    return out


def parse_variant(text: str) -> tuple[str, list[str]]:
    name, _, overrides = text.partition("=")
    if not name or not _:
        raise SystemExit(f"--variant {text!r}: expected NAME=\"override override ...\"")
    return name, shlex.split(overrides)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archs", nargs="+", default=["gpt2", "rwkv7"])
    ap.add_argument("--rows", nargs="+", default=[f"{a}@{c}" for a, c in ROWS], help="attention@ctx, e.g. power@65536")
    ap.add_argument("--variant", action="append", default=[], help='NAME="train.py overrides" (repeatable)')
    ap.add_argument("--docs", type=int, default=2, help="micro-batches per step (gradient accumulation)")
    ap.add_argument("--tokens", type=int, default=65536, help="tokens per micro-batch (documents = tokens // ctx)")
    ap.add_argument("--steps", type=int, default=4, help="timed steps, at least")
    ap.add_argument("--min-seconds", type=float, default=5.0,
                    help="time more steps until this long has passed (short steps: noise averages out)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--profile", nargs="*", default=[], metavar="ATTENTION@CTX",
                    help="print the CUDA time per kernel of one extra step of these rows")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    ap.add_argument("--data", default=None, help="a LongCrawl64-layout folder of >= 65536-token documents "
                                                 "(default: random tokens written to a temporary folder)")
    args = ap.parse_args(argv)
    variants = [parse_variant(v) for v in args.variant] or [("recipe", [])]
    for name, extra in variants:           # a misspelt kernel switch stops here, naming it, before any row runs
        try:
            switches.parse(split_kernel_switches(extra)[1])
        except switches.SwitchError as err:
            raise SystemExit(f"--variant {name}: kernel {err}") from None
        try:                                # a mistyped train.py key or option too, as train.py names it
            check_overrides(split_kernel_switches(extra)[0], CONF)
        except ValueError as err:
            print(f"error: --variant {name}: {err}", file=sys.stderr)
            sys.exit(2)
    rows_wanted = []
    for spec in args.rows:
        attention, _, ctx = spec.partition("@")
        if attention not in ("exp", "power", "linear", "window", "none") or not ctx.isdigit():
            raise SystemExit(f"--rows {spec!r}: expected ATTENTION@CTX, e.g. power@65536")
        rows_wanted.append((attention, int(ctx)))
    os.makedirs(args.out, exist_ok=True)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    scratch = Path(tempfile.mkdtemp(prefix="bench_train_"))
    max_ctx = max(c for _, c in rows_wanted)
    data = Path(args.data) if args.data else write_random_dataset(
        scratch / "data", max_ctx, n_train=args.docs * (args.warmup + args.steps + 2) * max(1, args.tokens // 1024),
        n_heldout=2)
    rows = []
    record = {"device": device, "torch": torch.__version__, "command": "python " + " ".join(map(shlex.quote, sys.argv)),
              "rows": rows}
    for arch in args.archs:
        for attention, ctx in rows_wanted:
            for variant, extra in variants:
                try:
                    row = bench_row(arch, attention, ctx, variant, extra, args, data, scratch)
                except Exception as e:  # recorded, not hidden: the table shows the failure
                    traceback.print_exc()
                    row = dict(arch=arch, attention=attention, ctx=ctx, variant=variant, overrides=" ".join(extra),
                               error=f"{type(e).__name__}: {e}".splitlines()[0])
                rows.append(row)
                msg = row["error"] or (f"{row['tokens_per_s']:,} tok/s  MFU {pct(row['mfu'])}  "
                                       f"{num(row['peak_gb'])} GB  checkpointing {row['checkpointing']}")
                print(f"{arch:6s} {attention:6s} ctx {ctx:6d} [{variant}]: {msg}", flush=True)
                # rewritten after every row: a sweep stopped part way keeps the rows it measured
                Path(args.out, "bench_train.json").write_text(json.dumps(record, indent=1) + "\n")
    print(write_table(rows, Path(args.out, "bench_train.md"), device))
    return record


if __name__ == "__main__":
    main()
