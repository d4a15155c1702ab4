"""The attention benchmark's inputs and callables, shared by scripts/bench_attention.py and the kernel tuning tools
(so a tuning run times exactly what the benchmark times).

Shape (b, t, h, d) bf16 on CUDA, q, k, v scaled by 1/sqrt(d) and gated (log_g ~ logsigmoid(N(6.9, 1))); every
implementation is a call `(q, k, v, log_g) -> y`.
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

DEV = "cuda"


def require_cuda(what: str) -> None:
    """One line `error: WHAT needs a CUDA device ...` on stderr and exit 2 where torch sees no CUDA device (before
    the benchmark writes anything): its timings are of CUDA kernels."""
    if torch.cuda.is_available():
        return
    why = "this torch is built without CUDA" if torch.version.cuda is None else "no GPU is visible"
    print(f"error: {what} needs a CUDA device; {why} (torch {torch.__version__})", file=sys.stderr)
    raise SystemExit(2)


def inputs(b, t, h, d, grad):
    xs = [(torch.randn(b, t, h, d, device=DEV, dtype=torch.bfloat16) / math.sqrt(d)).requires_grad_(grad)
          for _ in range(3)]
    lg = F.logsigmoid(torch.randn(b, t, h, device=DEV) + 6.9).requires_grad_(grad)
    return xs, lg


def run_once(call, q, k, v, lg, backward):
    """One call of an implementation: the forward under no_grad, or forward and backward (upstream gradient of
    ones, the benchmark's). The backward returns the inputs' gradients (torch.autograd.grad) rather than adding
    them into .grad: q, k, v are activations in a model, whose gradients flow on to the projections; accumulating
    them into leaves timed one more elementwise add per input and call, for every implementation (H100, b=8, h=12,
    64k: 0.9 ms of longctx's fwd+bwd, 3.8 ms of cuDNN's)."""
    if not backward:
        with torch.no_grad():
            return call(q, k, v, lg)
    o = call(q, k, v, lg)
    leaves = [x for x in (q, k, v, lg) if x.requires_grad]
    return torch.autograd.grad(o, leaves, torch.ones_like(o), allow_unused=True)     # softmax leaves log_g unused


def make_sdpa(backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]

    def call(q, k, v, lg):
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), is_causal=True)
    return call


def make_ours(p, impl="auto"):
    """The public API; impl sets LONGCTX_POWER_IMPL for the call (auto: the default routing of plan.py, called
    as a user would). Waits for the short-sequence C++ launcher's one-time build (native/launcher.py) first."""
    from longctx.kernels import power_attention
    from longctx.kernels.power.native import launcher as native

    if torch.cuda.is_available():
        native.wait()
    if impl == "auto":
        return lambda q, k, v, lg: power_attention(q, k, v, lg, p=p, norm=p % 2 == 0)   # odd p: numerator only

    def call(q, k, v, lg):
        os.environ["LONGCTX_POWER_IMPL"] = impl
        try:
            return power_attention(q, k, v, lg, p=p, norm=p % 2 == 0)   # odd p: numerator only
        finally:
            os.environ.pop("LONGCTX_POWER_IMPL")
    return call


def make_ours_chunked(p, chunk):
    """The Triton chunked-form kernels directly, at a given chunk size."""
    from longctx.kernels.power.autograd import chunked_form

    def call(q, k, v, lg):
        return chunked_form(q, k, v, lg, p=p, scale=q.shape[-1] ** -0.5, chunk_size=chunk, norm=p % 2 == 0)
    return call


def profile(name, call, b, t, h, d):
    """Per-kernel CUDA time of one fwd+bwd (after a warm-up call), printed as a table (PROFILE lines)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile
    try:
        (q, k, v), lg = inputs(b, t, h, d, True)
        call(q, k, v, lg).float().sum().backward()
        torch.cuda.synchronize()
        with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
            call(q, k, v, lg).float().sum().backward()
            torch.cuda.synchronize()
        print(f"PROFILE {name} t={t} d={d}", flush=True)
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15), flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"PROFILE {name} t={t} d={d} failed: {e!r}"[:300], flush=True)
    torch.cuda.empty_cache()
