"""Host cost of the attention form's Python path without the GPU: the Triton launches replaced by no-ops and tiny CPU
tensors (b=1, t=16, h=2, d=64), so what is timed is our own Python (checks, configs, buffers) and torch's autograd
machinery, beside an empty Python autograd node and a C++ node (x * 1.0) over the same leaves. Complements
tools/host_overhead.py, whose pieces on shared GPU machines swing ~30% run to run. The autograd engine runs CPU
backward passes on the calling thread, so the CUDA engine's hand-off to its device thread is not in these numbers.

    python -m tools.host_overhead_cpu
"""
import argparse
import time

import torch

from longctx.kernels.power import autograd, kernel_index
from longctx.kernels.power import parallel as ta
from longctx.kernels.power.interface import check_inputs
from longctx.kernels.power.plan import make_plan


class EmptyNode(torch.autograd.Function):
    """The floor of a Python autograd node over the attention's four leaves (q, k, v, log_g): no work, gradients of
    the leaves' shapes and dtypes (also used by tools/host_overhead.py)."""

    @staticmethod
    def forward(ctx, q, k, v, lg):
        ctx.lg_meta = lg.shape, lg.dtype
        return torch.empty_like(q)

    @staticmethod
    def backward(ctx, dy):
        shape, dtype = ctx.lg_meta
        return torch.empty_like(dy), torch.empty_like(dy), torch.empty_like(dy), dy.new_empty(shape, dtype=dtype)


class _NoLaunch:
    """Stands in for a Triton kernel: kernel[grid](...) does nothing."""
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def host_us(fn, n=2000):
    for _ in range(50):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main():
    with kernel_index.stand_in({name: _NoLaunch() for name in ("attn_fwd", "attn_dq", "attn_dkdv", "segment_cumsum")}):
        time_pieces()


def time_pieces():
    b, t, h, d = 1, 16, 2, 64
    q, k, v = (torch.randn(b, t, h, d, dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    lg = torch.randn(b, t, h).requires_grad_()
    qd, kd, vd, lgd = (x.detach() for x in (q, k, v, lg))
    scale = d ** -0.5
    o, lse, G = ta.attention_forward(qd, kd, vd, lgd, scale, 2, True)
    do = torch.ones_like(o)

    plan = make_plan(t, 2, d, q.dtype, "cuda", form="attention")

    def form_fwd_bwd():
        autograd.python_node(plan, q, k, v, lg, scale).backward(do)

    def empty_fwd_bwd():
        EmptyNode.apply(q, k, v, lg).backward(do)

    def cpp_fwd_bwd():
        (q * 1.0).backward(do)

    pieces = (("check_inputs", lambda: check_inputs(q, k, v, lg, 2, None, None, True, None)),
              ("launch_config", lambda: ta.launch_config(d, "dkdv", *ta.dot_dtype(q.dtype, True, True))),
              ("attention_forward, no launches", lambda: ta.attention_forward(qd, kd, vd, lgd, scale, 2, True)),
              ("attention_backward, no launches",
               lambda: ta.attention_backward(do, qd, kd, vd, G, o, lse, scale, 2, True, True)),
              ("AttentionForm fwd+bwd, no launches", form_fwd_bwd),
              ("empty Python node fwd+bwd", empty_fwd_bwd),
              ("C++ node (x * 1.0) fwd+bwd", cpp_fwd_bwd))
    for name, fn in pieces:
        print(f"{name:36s} {host_us(fn):8.1f} us", flush=True)


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
