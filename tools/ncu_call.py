"""One p=2 chunked fwd+bwd for the ncu scripts (ncu_state.sh, ncu_source.sh, ncu_pipes.sh) to profile: b=8, h=12,
d=64, bf16, gated, chunk 1024, the benchmark's inputs (bench_attention.inputs).

    ncu ... python3 scripts/gpu/ncu_call.py --t 16384 [--one-stream]
"""
import argparse

import torch

from scripts.bench_attention import inputs
from longctx.kernels.power import triton_sym2
from longctx.kernels.power.triton_chunked import chunked_form


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--t", type=int, default=16384)
    ap.add_argument("--one-stream", action="store_true",
                    help="the backward on one stream (CONCURRENT_BWD off): each kernel alone, as ncu runs them anyway")
    args = ap.parse_args()
    if args.one_stream:
        triton_sym2.CONCURRENT_BWD = False
    xs, lg = inputs(8, args.t, 12, 64, True)
    y = chunked_form(*xs, lg, p=2, scale=0.125, chunk_size=1024, norm=True)
    y.backward(torch.ones_like(y))
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
