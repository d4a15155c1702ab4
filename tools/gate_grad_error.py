"""How accurate is d(log g) from bf16 inputs, and how accurate can it be?

For each case it measures, as relative Frobenius errors ||x - x_ref|| / ||x_ref||:
  kernel_bf16   the kernel on bf16 inputs   vs float64 on the same bf16 inputs (what the GPU tests check);
  kernel_fp32   the kernel on fp32 inputs   vs float64 on the same fp32 inputs (is the kernel's math right?);
  rounding      float64 on bf16-rounded inputs vs float64 on the fp32 inputs (how far the exact gradient moves
                when only the inputs q, k, v, dy are rounded to bf16: the floor of any bf16 pipeline).
d(log g) sums, from the end of the sequence, the query side's and the key side's gate gradients, whose totals
cancel exactly (for the normalized form both are sums of P_ij (dP_ij - delta_i)); the small result of a
cancellation of large terms is where relative errors grow.

    python tools/gate_grad_error.py --out results.json            # CUDA; the cases of the bf16 accuracy study
    python tools/gate_grad_error.py --device cpu --tiny           # CPU: the reference path, small sizes
    python -m tools.gate_grad_error --switches attention.offdiag_fp32_grads=1  # kernels.power.switches
"""
from __future__ import annotations

import argparse
import contextlib
import json

import torch

from longctx.kernels import power_attention
from longctx.kernels.power.reference import power_attention_reference

NAMES = ("dq", "dk", "dv", "dlog_g")
CASES = [  # p, norm, d, t, hq, hk
    (2, True, 128, 4096, 4, 2), (2, True, 128, 8192, 4, 2), (3, False, 64, 4096, 4, 2), (3, False, 128, 4096, 4, 2),
    (2, True, 64, 4096, 4, 2), (2, True, 64, 8192, 4, 2), (1, False, 64, 4096, 4, 2), (4, True, 64, 4096, 4, 2)]
TINY_CASES = [(2, True, 32, 96, 2, 1), (3, False, 32, 80, 2, 2)]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def draw(case, device, seed=0):
    """fp32 inputs of a case (q, k, v, log_g, dy); gated, GQA."""
    p, norm, d, t, hq, hk = case
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(1, t, hq, d, device=device, generator=g)
    k = torch.randn(1, t, hk, d, device=device, generator=g)
    v = torch.randn(1, t, hk, d, device=device, generator=g)
    lg = -0.5 * torch.rand(1, t, hk, device=device, generator=g)
    dy = torch.randn(1, t, hq, d, device=device, generator=g)
    return q, k, v, lg, dy


def grads(fn, q, k, v, lg, dy, dtype, p, norm):
    """Gradients of sum(dy * fn(q, k, v, lg)) with q, k, v, dy cast to dtype (log_g stays fp32 / float64)."""
    leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
    lg_leaf = lg.detach().to(torch.float64 if dtype == torch.float64 else torch.float32).requires_grad_()
    y = fn(*leaves, lg_leaf, p=p, norm=norm)
    return torch.autograd.grad(y, [*leaves, lg_leaf], dy.to(y.dtype))


def measure(case, device):
    p, norm, *_ = case
    q, k, v, lg, dy = draw(case, device)
    r16 = [x.to(torch.bfloat16).float() for x in (q, k, v, dy)]                # the bf16-rounded inputs
    exact_fp32 = grads(power_attention_reference, q, k, v, lg, dy, torch.float64, p, norm)
    exact_bf16 = grads(power_attention_reference, *r16[:3], lg, r16[3], torch.float64, p, norm)
    row = {"p": p, "norm": norm, "d": case[2], "t": case[3], "hq": case[4], "hk": case[5]}
    row["rounding"] = {n: rel_err(a, b) for n, a, b in zip(NAMES, exact_bf16, exact_fp32)}
    if device == "cuda":
        kb = grads(power_attention, *r16[:3], lg, r16[3], torch.bfloat16, p, norm)
        kf = grads(power_attention, q, k, v, lg, dy, torch.float32, p, norm)
        row["kernel_bf16"] = {n: rel_err(a, b) for n, a, b in zip(NAMES, kb, exact_bf16)}
        row["kernel_fp32"] = {n: rel_err(a, b) for n, a, b in zip(NAMES, kf, exact_fp32)}
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="small cases (CPU tests)")
    ap.add_argument("--out", help="write the rows as JSON here")
    ap.add_argument("--switches", nargs="*", default=[],
                    help="FIELD=VALUE kernel switches (longctx.kernels.power.switches)")
    args = ap.parse_args(argv)
    from longctx.kernels.power import switches
    try:
        switches.parse(args.switches)
    except switches.SwitchError as err:
        ap.error(f"--switches: {err}")
    rows = []
    with contextlib.ExitStack() as stack:
        if args.switches:
            stack.enter_context(switches.applied(args.switches))
        _run_cases(args, rows)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                       "switches": args.switches, "rows": rows}, f, indent=1)
    return rows


def _run_cases(args, rows):
    for case in TINY_CASES if args.tiny else CASES:
        row = measure(case, args.device)
        rows.append(row)
        cols = [k for k in ("kernel_bf16", "kernel_fp32", "rounding") if k in row]
        print(f"p={row['p']} norm={row['norm']} d={row['d']} t={row['t']}: " + "  ".join(
            f"{c} " + " ".join(f"{n}={row[c][n] * 100:.2f}%" for n in NAMES) for c in cols), flush=True)
        if args.device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
