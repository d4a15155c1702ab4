"""The p=2 outer products (triton_sym2.launch_outer) with Gluon's kernel against Triton's, per chunk slot, states and
normalizer sums, and the keys' states against a float64 sum of e^(G_last - G_r) w phi(k_r) v_r^T (reference.expand).
Session 15 used it to narrow down Gluon at d=128 (states right, some normalizer rows wrong):

    python3 scripts/gpu/check_outer.py --d 128               # Gluon at d=128 against Triton's kernel
    python3 scripts/gpu/check_outer.py --d 128 --no-drain    # without GLUON_OUTER_DRAIN (the race it closes)
"""
import argparse

import torch

from longctx.kernels.power import triton_sym2 as sym2
from longctx.kernels.power.reference import expand, state_dim
from longctx.kernels.power.triton_chunked import _state_operands


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def run(keys, gated, out_dtype, b, T, hq, hk, d, C):
    hx = hk if keys else hq
    NC, DS = T // C, state_dim(2, d)
    X = torch.randn(b, T, hx, d, device="cuda").bfloat16()
    Y = torch.randn(b, T, hx, d, device="cuda").bfloat16()
    G = ((-0.5 * torch.rand(b, NC, C, hk, device="cuda")).cumsum(2).reshape(b, T, hk) if gated
         else torch.zeros(1, device="cuda"))
    LSE = torch.randn(b, T, hq, device="cuda") + 5
    DELTA = torch.randn(b, T, hq, device="cuda") * 3
    sdt, sprec = _state_operands(torch.bfloat16)
    outs = []
    dims = sym2.GLUON_OUTER_DIMS
    for gluon in (False, True):
        sym2.GLUON_OUTER_DIMS = tuple(x for x in dims if x != d) + ((d,) if gluon else ())
        OUT = torch.full((b, hk, NC + 1, DS, d), float("nan"), device="cuda", dtype=out_dtype)
        OUTZ = torch.full((b, hk, NC + 1, DS), float("nan"), device="cuda")
        sym2.launch_outer(X, Y, G, LSE, DELTA, OUT, OUTZ, 0.01, T, NC, DS, 1 if keys else 0, hx, hk, d, C, keys,
                          True, gated, sdt, sprec)
        outs.append((OUT, OUTZ))
    sym2.GLUON_OUTER_DIMS = dims
    (a, az), (g, gz) = outs
    first = 1 if keys else 0
    tag = f"{'keys' if keys else 'query'} {'gated' if gated else 'ungated'} {str(out_dtype)[6:]}"
    if keys:
        f = torch.ones(b, T, hk, device="cuda", dtype=torch.float64)
        if gated:
            Gc = G.double().reshape(b, NC, C, hk)
            f = (Gc[:, :, -1:] - Gc).exp().reshape(b, T, hk)
        ph = expand(X.double(), 2, weighted=True) * f[..., None]
        truth = torch.einsum("bnchf,bnchd->bhnfd", ph.reshape(b, NC, C, hk, DS), Y.double().reshape(b, NC, C, hk, d))
        for name, o in (("triton", a), ("gluon", g)):
            print(f"{tag} {name} vs float64 per chunk: "
                  + " ".join(f"{rel(o[:, :, n + 1], truth[:, :, n]):.1e}" for n in range(NC)))
    for n in range(first, first + NC):
        bad = (gz[:, :, n] - az[:, :, n]).abs() > 1e-2 * az[:, :, n].abs().max()
        print(f"{tag} slot {n}: states {rel(g[:, :, n], a[:, :, n]):.1e} normalizer {rel(gz[:, :, n], az[:, :, n]):.1e}"
              f" NaN {torch.isnan(g[:, :, n]).sum().item() + torch.isnan(gz[:, :, n]).sum().item()}"
              f" normalizer rows off by >1% of max: {bad.sum().item()} (first: {bad.nonzero()[:4, 2].tolist()})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--t", type=int, default=768)
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--no-drain", action="store_true", help="triton_sym2.GLUON_OUTER_DRAIN off: a step does not wait "
                    "for the previous step's matmuls before writing their operand registers (session 20: some "
                    "normalizer rows off at d=128)")
    args = ap.parse_args()
    sym2.GLUON_OUTER_DRAIN = not args.no_drain
    torch.manual_seed(0)
    for keys in (False, True):
        for gated in (False, True):
            for out_dtype in (torch.float32, torch.bfloat16):
                run(keys, gated, out_dtype, 1, args.t, 4, 2, args.d, args.chunk)


if __name__ == "__main__":
    main()
