"""A/B of triton_attention.GATE_SCORES on a GPU: fwd+bwd ms of the public
power_attention (b=8, h=12, d=64, bf16, gated, p=2) with the key gate factor on the scores vs folded into k.

    python scripts/gpu/ab_gate_scores.py --ctxs 1024,4096,16384
"""
import argparse
import sys
from pathlib import Path

from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_attention import inputs, make_ours, run_once  # noqa: E402
from longctx.kernels.power import triton_attention  # noqa: E402

OURS = make_ours(2)


def fwd_bwd(xs, lg):
    run_once(OURS, *xs, lg, True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctxs", default="1024,4096,16384")
    args = ap.parse_args()
    for t in (int(c) for c in args.ctxs.split(",")):
        xs, lg = inputs(8, t, 12, 64, True)
        row = []
        for on in (False, True):
            triton_attention.GATE_SCORES = on
            fwd_bwd(xs, lg)                                   # compile
            row.append(do_bench(lambda: fwd_bwd(xs, lg), warmup=5, rep=50, return_mode="median"))
        print(f"t={t}: folded into k {row[0]:.3f} ms, on the scores {row[1]:.3f} ms ({row[0] / row[1]:.2f}x)",
              flush=True)


if __name__ == "__main__":
    main()
