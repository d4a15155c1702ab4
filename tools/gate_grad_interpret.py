"""d(log g) of the attention form's Triton kernels on bf16 inputs, on CPU: the kernels run under TRITON_INTERPRET=1
with bf16 emulated as the GPU rounds it, so each bf16 rounding point of the kernels shows in the gate gradient's
error (the accumulation order does not: numpy sums in its own order).

The interpreter's own bf16 handling is not usable here: it multiplies bf16 matmul operands as their raw 16-bit
integers and truncates fp32 -> bf16 casts. bf16_emulation() replaces both for the process: matmul operands widened
to fp32 (bf16 products are exact in fp32, as on the tensor cores), casts rounded to nearest even (as cvt.rn.bf16),
and a matmul of an fp32 with a bf16 operand (a tile kept in fp32 by an experiment) done in fp32.

For each variant (kernels.power.switches items joined by '+', or "default") it prints the relative Frobenius error of
dq, dk, dv and d(log g) against float64 on the same bf16 inputs, and the input floor (float64 on the bf16-rounded
inputs against float64 on the fp32 inputs), as tools/gate_grad_error.py does on a GPU:

    TRITON_INTERPRET=1 python -m tools.gate_grad_interpret --d 128 --t 1024 --hq 2 --hk 1 \\
        --variants default attention.offdiag_fp32_grads=1
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np


def bf16_emulation():
    """Patch the Triton interpreter (this process) to round bf16 as the GPU does (module docstring)."""
    import triton.language as tl
    from triton.language import semantic
    from triton.runtime import interpreter

    def widen(h):
        return (h.data.astype(np.uint32) << 16).view(np.float32) if h.dtype.scalar == tl.bfloat16 else h.data

    def round_bf16(x):
        u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)    # nearest, ties to even (no NaN here)

    plain_cast = interpreter.InterpreterBuilder.cast_impl

    def cast_impl(self, src, dst_type):
        s, d = src.dtype.scalar, dst_type.scalar
        if d == tl.bfloat16 and s != tl.bfloat16:
            return interpreter.TensorHandle(round_bf16(src.data.astype(np.float32)), tl.bfloat16)
        if s == tl.bfloat16 and d != tl.bfloat16:
            return interpreter.TensorHandle(widen(src).astype(interpreter._get_np_dtype(dst_type)), d)
        return plain_cast(self, src, dst_type)

    def create_dot(self, a, b, acc, input_precision, max_num_imprecise_acc):
        return interpreter.TensorHandle(np.matmul(widen(a), widen(b), dtype=np.float32) + acc.data, acc.dtype.scalar)

    plain_dot = semantic.TritonSemantic.dot

    def dot(self, lhs, rhs, acc, input_precision, max_num_imprecise_acc, out_dtype):
        if lhs.dtype != rhs.dtype:
            lhs, rhs = self.cast(lhs, tl.float32), self.cast(rhs, tl.float32)
        return plain_dot(self, lhs, rhs, acc, input_precision, max_num_imprecise_acc, out_dtype)

    interpreter.InterpreterBuilder.cast_impl = cast_impl
    interpreter.InterpreterBuilder.create_dot = create_dot
    semantic.TritonSemantic.dot = dot


def measure(p, d, t, hq, hk, variants, seed=0):
    """{"floor": errors, variant: errors} for one gated, normalized case; errors {name: relative error}."""
    import torch

    from longctx.kernels.power.autograd import attention_form
    from longctx.kernels.power.reference import power_attention_reference
    from longctx.kernels.power import switches
    from tools.gate_grad_error import NAMES, draw, grads, rel_err

    def kernel(q, k, v, lg, *, p, norm):
        return attention_form(q, k, v, lg, p=p, scale=q.shape[-1] ** -0.5, norm=norm)

    q, k, v, lg, dy = draw((p, True, d, t, hq, hk), "cpu", seed)
    r16 = [x.to(torch.bfloat16).float() for x in (q, k, v, dy)]
    exact = grads(power_attention_reference, q, k, v, lg, dy, torch.float64, p, True)
    exact_bf16 = grads(power_attention_reference, *r16[:3], lg, r16[3], torch.float64, p, True)
    out = {"floor": {n: rel_err(a, b) for n, a, b in zip(NAMES, exact_bf16, exact)}}
    for spec in variants:
        items = [] if spec == "default" else spec.split("+")
        with switches.applied(items):
            got = grads(kernel, *r16[:3], lg, r16[3], torch.bfloat16, p, True)
        out[spec] = {n: rel_err(a, b) for n, a, b in zip(NAMES, got, exact_bf16)}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--p", type=int, default=2)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--t", type=int, default=1024)
    ap.add_argument("--hq", type=int, default=2)
    ap.add_argument("--hk", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", nargs="+", default=["default"])
    ap.add_argument("--out", help="write the errors as JSON here")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("TRITON_INTERPRET=1 must be set before the run (Triton reads it at import)")
    bf16_emulation()
    rows = measure(args.p, args.d, args.t, args.hq, args.hk, args.variants, args.seed)
    for name, errs in rows.items():
        print(f"p={args.p} d={args.d} t={args.t} hq={args.hq} hk={args.hk} {name}: "
              + " ".join(f"{n}={e * 100:.3f}%" for n, e in errs.items()), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
