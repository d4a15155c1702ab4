"""One p=2 chunked fwd+bwd for the ncu scripts (ncu_state.sh, ncu_source.sh, ncu_pipes.sh) to profile: b=8, h=12,
d=64, bf16, gated, chunk 1024, the benchmark's inputs (longctx.kernels.bench.inputs).

    ncu ... python -m tools.ncu_call --t 16384 [--one-stream]
"""
import argparse

import torch

from longctx.kernels.bench import inputs
from longctx.kernels.power.autograd import chunked_form
from longctx.kernels.power.chunk_p2 import config as p2_config


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--t", type=int, default=16384)
    ap.add_argument("--one-stream", action="store_true",
                    help="the backward on one stream (concurrent_bwd off): each kernel alone, as ncu runs them anyway")
    args = ap.parse_args()
    xs, lg = inputs(8, args.t, 12, 64, True)
    with p2_config.override(concurrent_bwd=not args.one_stream):
        y = chunked_form(*xs, lg, p=2, scale=0.125, chunk_size=1024, norm=True)
        y.backward(torch.ones_like(y))
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
