"""Where the time of a power_attention call goes (GPU): per-kernel CUDA times and counts from torch.profiler beside
the wall time per call, for the public API (b=8, h=12, d=64, bf16, gated, p=2) at the given lengths, cuDNN beside.
`--batch 1,8` repeats each length at those batch sizes (a training micro-batch of one 64k document is b=1).

    python -m tools.profile_attn --ctxs 1024,4096
    python -m tools.profile_attn --ctxs 65536 --impls ours --modes fwd+bwd --top 0 --out DIR
        (every kernel of one 64k fwd+bwd: the small ones and the gaps between kernels; profile_attn.json in DIR)
    python -m tools.profile_attn --ctxs 4096 --impls ours --switches fused_backward=1 concurrent_bwd=0
        (ours under kernel switches, as tools.ab_switch's FIELD=VALUE items)
"""
import argparse
import json
import os
import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from longctx.kernels.bench import inputs, make_ours, make_sdpa, run_once
from longctx.kernels.power import switches


def host_ms(fn, n=50):
    """Mean wall ms per call with the GPU kept busy-free: sync, n calls, sync."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctxs", default="1024,4096")
    ap.add_argument("--impls", default="ours,cudnn", help="comma list of ours, cudnn")
    ap.add_argument("--modes", default="fwd,fwd+bwd", help="comma list of fwd, fwd+bwd")
    ap.add_argument("--batch", default="8", help="comma list of batch sizes")
    ap.add_argument("--top", type=int, default=14, help="profiler rows printed per call (0: all)")
    ap.add_argument("--out", default="", help="directory for profile_attn.json (every kernel of every call)")
    ap.add_argument("--switches", nargs="*", default=[], help="FIELD=VALUE kernel switches for every call")
    args = ap.parse_args()
    try:
        switches.parse(args.switches)      # a bad item fails here, before any GPU time
    except switches.SwitchError as err:
        raise SystemExit(f"--switches: {err}") from None
    items = list(args.switches)
    if not any(item.split("=")[0].endswith("concurrent_bwd") for item in items):
        # the chunked backward's two streams: torch.profiler did not return from them (H100, t=5120); one stream does
        items.append("concurrent_bwd=0")
        print("profile_attn: concurrent_bwd=0 (the chunked backward on one stream; --switches concurrent_bwd=1 to "
              "profile both streams)", flush=True)
    with switches.applied(items):
        profile_calls(args)


def profile_calls(args):
    makers = {"ours": lambda: make_ours(2), "cudnn": lambda: make_sdpa("cudnn")}
    unknown = [n for n in args.impls.split(",") if n not in makers]
    if unknown:
        raise SystemExit(f"--impls: {unknown} not among {sorted(makers)}")
    impls = {n: makers[n]() for n in args.impls.split(",")}
    runs = []
    for t, b in [(t, b) for t in map(int, args.ctxs.split(",")) for b in map(int, args.batch.split(","))]:
        xs, lg = inputs(b, t, 12, 64, True)
        for name, call in impls.items():
            for mode in args.modes.split(","):
                def fn():
                    run_once(call, *xs, lg, mode == "fwd+bwd")
                wall = host_ms(fn)
                with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                    for _ in range(10):
                        fn()
                    torch.cuda.synchronize()
                rows = [(e.key, e.device_time_total / 10 / 1e3, e.count // 10) for e in prof.key_averages()
                        if e.device_time_total > 0]
                rows.sort(key=lambda r: -r[1])
                # kernels only: the CPU-side rows (aten::, autograd nodes and engine) carry their kernels' time again
                cuda = {e.key for e in prof.key_averages() if e.device_type == DeviceType.CUDA}
                kernels = [r for r in rows if r[0] in cuda]
                gpu = sum(r[1] for r in kernels)
                print(f"== t={t} b={b} {name} {mode}: wall {wall:.3f} ms/call, kernels {gpu:.3f} ms", flush=True)
                for key, ms, cnt in rows[:args.top or None]:
                    print(f"   {ms:8.4f} ms  x{cnt}  {key[:90]}", flush=True)
                runs.append({"t": t, "b": b, "impl": name, "mode": mode, "wall_ms": wall, "kernel_ms": gpu,
                             "kernels": [{"name": k, "ms": ms, "count": c} for k, ms, c in kernels]})
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "profile_attn.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
