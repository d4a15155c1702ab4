"""A/B of attention-form kernel versions on a GPU: run once per source tree (PYTHONPATH picks the tree), same card.

    python3 scripts/gpu/ab_attn.py --tag new --ctxs 1024,4096,16384 [--forms 8192,16384] [--sweep 4096] [--cudnn]
        [--set FAST_FORWARD=0] (kernel switches, as tune_sym2.py's --set)
        [--p 1]             (another degree; p=1's form threshold: --p 1 --ctxs 1024 --forms 1024,2048,4096,8192)

The other tree travels as an untracked folder (the device copies untracked, not-ignored files), e.g. a branch:
    mkdir -p _ab/base && git archive BRANCH src | tar -x -C /tmp/ab && cp -r /tmp/ab/src _ab/base/longctx
and on the device: PYTHONPATH=_ab/base:$PYTHONPATH python3 scripts/gpu/ab_attn.py --tag base ...
(delete _ab before committing).
Prints one JSON line per measurement: fwd and fwd+bwd median ms of the public power_attention (b=8, h=12, d=64,
bf16, gated, p=2 or --p; the benchmark's inputs), optionally cuDNN beside it, the chunked vs attention form at --forms,
and a block sweep of the attention-form kernels at --sweep (forward, dk/dv and dq, each alone).
"""
import argparse
import json
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_attention import inputs, make_ours, make_sdpa, run_once  # noqa: E402
from tune_sym2 import apply_switches  # noqa: E402
import longctx  # noqa: E402
from longctx.kernels.power import triton_attention as ta  # noqa: E402


def timed(fn):
    fn()
    torch.cuda.synchronize()
    return round(do_bench(fn, warmup=5, rep=40, return_mode="median"), 4)


def fwd_bwd_ms(call, xs, lg):
    return timed(lambda: run_once(call, *xs, lg, False)), timed(lambda: run_once(call, *xs, lg, True))


def emit(**kw):
    print(json.dumps(kw), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tag", required=True)
    ap.add_argument("--ctxs", default="1024,4096,16384")
    ap.add_argument("--cudnn", action="store_true")
    ap.add_argument("--forms", default="")
    ap.add_argument("--sweep", type=int, default=0)
    ap.add_argument("--regs", action="store_true", help="--sweep: configs with a register cap (maxnreg) instead")
    ap.add_argument("--p", type=int, default=2, help="power degree (odd p: numerator only, as the benchmark)")
    ap.add_argument("--set", nargs="*", default=[], metavar="NAME=INT",
                    help="kernel switches for this run, as tune_sym2.py's --set (e.g. FAST_FORWARD=0)")
    args = ap.parse_args()
    apply_switches(args.set)
    emit(tag=args.tag, sets=args.set, src=str(Path(longctx.__file__).parent), dev=torch.cuda.get_device_name())
    ours = make_ours(args.p)
    for t in map(int, args.ctxs.split(",")):
        xs, lg = inputs(8, t, 12, 64, True)
        f, fb = fwd_bwd_ms(ours, xs, lg)
        emit(tag=args.tag, t=t, p=args.p, impl="auto", fwd=f, fwd_bwd=fb)
        if args.cudnn:
            f, fb = fwd_bwd_ms(make_sdpa("cudnn"), xs, lg)
            emit(tag=args.tag, t=t, impl="cudnn", fwd=f, fwd_bwd=fb)
    for t in [int(x) for x in args.forms.split(",") if x]:
        xs, lg = inputs(8, t, 12, 64, True)
        for impl in ("chunked", "attention"):
            f, fb = fwd_bwd_ms(make_ours(args.p, impl), xs, lg)
            emit(tag=args.tag, t=t, p=args.p, impl=impl, fwd=f, fwd_bwd=fb)
    if args.sweep:
        t = args.sweep
        xs, lg = inputs(8, t, 12, 64, True)
        fwd_cfgs = [(128, 64, 4, 3), (128, 64, 4, 4), (128, 64, 8, 3), (128, 128, 8, 3), (128, 32, 4, 4),
                    (64, 64, 4, 4), (64, 32, 4, 4), (128, 128, 4, 2)]
        bwd_cfgs = [(64, 64, 4, 3), (64, 64, 4, 2), (64, 64, 8, 2), (128, 64, 8, 2), (64, 32, 4, 3),
                    (128, 128, 8, 2), (128, 32, 4, 2), (32, 32, 4, 3), (128, 64, 4, 2),
                    # BN > BM (dk/dv only takes its fast path so): no spill at (32, 64) (the default spills 120 B)
                    (32, 64, 4, 3), (32, 64, 4, 2), (32, 64, 8, 2), (32, 128, 8, 2)]
        if args.regs:       # (BM, BN, warps, stages, maxnreg): more programs per SM where registers limit them
            fwd_cfgs = [(128, 64, 4, 4), (128, 64, 4, 3, 168), (128, 64, 4, 2, 168), (128, 64, 4, 2, 128),
                        (64, 64, 4, 3, 128), (64, 64, 4, 2, 128), (128, 32, 4, 3, 168)]
            bwd_cfgs = [(64, 64, 4, 3), (64, 64, 4, 3, 168), (64, 64, 4, 2, 168), (64, 64, 4, 2, 128),
                        (64, 64, 4, 1, 128), (32, 64, 4, 2, 128), (64, 32, 4, 2, 128)]
        for which, cfgs in (("fwd", fwd_cfgs), ("dkdv", bwd_cfgs), ("dq", bwd_cfgs)):   # the other kernels keep theirs
            for cfg in cfgs:
                ta.BLOCK_OVERRIDE.clear()
                ta.BLOCK_OVERRIDE[which] = cfg
                try:
                    f, fb = fwd_bwd_ms(ours, xs, lg)
                except Exception as e:  # noqa: BLE001
                    f = fb = repr(e)[:120]
                emit(tag=args.tag, t=t, sweep=which, cfg=cfg, fwd=f, fwd_bwd=fb)
        ta.BLOCK_OVERRIDE.clear()


if __name__ == "__main__":
    main()
