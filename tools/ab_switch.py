"""A/B of kernel switches in one process on a GPU: fwd+bwd (and fwd) ms of the public power_attention (b=8, h=12,
d=64 or --d, bf16, gated, p=2) under each variant, the variants interleaved over several rounds so that clock and
thermal drift hit them alike (the median of the rounds' medians is reported).

A variant is '+'-joined items: FIELD=VALUE overrides a field of a kernel config (kernels.power.switches: chunk_p2's,
attention, chunk, gates, dispatch), attn:KERNEL=BM,BN,warps,stages[,maxnreg] an attention tile (the attention
config's block_override), and "default" nothing. Each variant runs inside its own overrides: nothing leaks into
the next.

Speed is not all: in the first round each variant's output and gradients (one fwd+bwd, upstream gradient of ones)
are compared with the first variant's, and a relative error above --tol is flagged DISAGREES (a cp.async ring too
short to be correct once timed 2% faster).

    python -m tools.ab_switch --variants concurrent_bwd=0 concurrent_bwd=1 --ctxs 65536,8192
    python -m tools.ab_switch --variants outer_stages=3 outer_stages=4 --ctxs 16384,65536
    python -m tools.ab_switch --variants default outer_stages=3 dispatch.chunk_p2=1024
"""
import argparse
import json
import os
import statistics

import torch
from triton.testing import do_bench

from longctx.kernels.bench import inputs, make_ours, run_once
from longctx.kernels.power import parallel
from longctx.kernels.power import switches

OURS = make_ours(2)
NAMES = ("y", "dq", "dk", "dv", "dlog_g")


def outputs(q, k, v, lg):
    """y and the gradients of q, k, v, log_g of one fwd+bwd of OURS (upstream gradient of ones)."""
    leaves = [x.detach().requires_grad_() for x in (q, k, v, lg)]
    y = OURS(*leaves)
    return [y.detach()] + list(torch.autograd.grad(y, leaves, torch.ones_like(y)))


def disagreement(outs, ref) -> dict:
    """Relative error (Frobenius, in fp32) of each of outputs()' tensors against the reference variant's (kept on
    the host between variants, so that the peak memory measured is the variant's own)."""
    errs = {}
    for name, a, b in zip(NAMES, outs, ref):
        a, b = a.float(), b.to(a.device).float()
        errs[name] = ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
    return errs


def parse_variant(spec: str):
    """'A=1+attn:fwd=64,32,4,3' -> (switch items, {kernel: tile})."""
    items, tiles = [], {}
    for item in filter(None, spec.split("+")):
        if item == "default":
            continue
        if item.startswith("attn:"):
            kernel, cfg = item[5:].split("=")
            if kernel not in (*parallel.KERNELS, "bwd"):
                raise SystemExit(f"--variants: attention kernel {kernel!r} is not one of {parallel.KERNELS}")
            tiles[kernel] = tuple(int(x) for x in cfg.split(","))
        elif "=" in item:
            items.append(item)
        else:
            raise SystemExit(f"--variants: item {item!r} is neither FIELD=VALUE, attn:KERNEL=TILE nor 'default'")
    try:
        switches.parse(items)      # a bad field or value fails here, before any GPU time
    except switches.SwitchError as err:
        raise SystemExit(f"--variants: {err}") from None
    return items, tiles



def measure(spec, first_round, xs, lg, modes, times, peak, errs, failed, ref, t):
    """One round of one variant (its switches applied by the caller): in the first round its outputs against the
    reference's (the first variant's, returned), then the time of each mode. A variant that fails (a tile that does
    not fit shared memory or registers) is dropped, not the run."""
    if first_round:
        try:
            outs = outputs(*xs, lg)
        except Exception as e:  # noqa: BLE001
            failed[spec] = f"{type(e).__name__}: {str(e)[:200]}"
            print(f"t={t} {spec}: failed: {failed[spec]}", flush=True)
            torch.cuda.empty_cache()
            return ref
        ref = ref if ref is not None else [x.cpu() for x in outs]
        errs[spec] = disagreement(outs, ref)
        del outs
    for m, bwd in modes:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        run_once(OURS, *xs, lg, bwd)                     # compile (first round) / warm
        torch.cuda.synchronize()
        peak[(spec, m)] = torch.cuda.max_memory_allocated() / 1e9
        times[(spec, m)].append(do_bench(lambda: run_once(OURS, *xs, lg, bwd), warmup=25, rep=500,
                                         return_mode="median"))
    return ref


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", nargs="+", required=True)
    ap.add_argument("--ctxs", default="65536")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--d", type=int, default=64, help="head dim")
    ap.add_argument("--fwd", action="store_true", help="also time the forward alone")
    ap.add_argument("--out", default=os.environ.get("OUT", "runs/ab_switch"))
    ap.add_argument("--tol", type=float, default=1e-2, help="largest relative error against the first variant")
    args = ap.parse_args()
    variants = {spec: parse_variant(spec) for spec in args.variants}
    res = {"device": torch.cuda.get_device_name(), "d": args.d, "variants": args.variants, "rows": []}
    for t in (int(c) for c in args.ctxs.split(",")):
        xs, lg = inputs(8, t, 12, args.d, True)
        modes = [("fwd+bwd", True)] + ([("fwd", False)] if args.fwd else [])
        times = {(spec, m): [] for spec in variants for m, _ in modes}
        peak, errs, ref, failed = {}, {}, None, {}
        for r in range(args.rounds):
            for spec, (items, tiles) in variants.items():
                if spec not in failed:
                    with switches.applied(items, tiles):
                        ref = measure(spec, r == 0, xs, lg, modes, times, peak, errs, failed, ref, t)
        res["rows"] += [dict(t=t, variant=spec, error=err) for spec, err in failed.items()]
        for m, _ in modes:
            first = statistics.median(times[(args.variants[0], m)])
            for spec in (s for s in variants if s not in failed):
                ms = statistics.median(times[(spec, m)])
                worst = max(errs[spec].values())
                row = dict(t=t, mode=m, variant=spec, ms=ms, rounds=times[(spec, m)], vs_first=first / ms,
                           peak_gb=peak[(spec, m)], rel_err_vs_first=errs[spec])
                res["rows"].append(row)
                print(f"t={t} d={args.d} {m:8s} {spec:40s} {ms:8.3f} ms  ({first / ms:.3f}x the first; peak "
                      f"{peak[(spec, m)]:.2f} GB; rounds " + " ".join(f"{x:.2f}" for x in times[(spec, m)])
                      + f"; vs the first's outputs {worst:.1e}" + (" DISAGREES" if worst > args.tol else "") + ")",
                      flush=True)
        del xs, lg, ref
        torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "ab_switch.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
