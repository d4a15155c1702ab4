"""Every CUDA kernel of one chunked-form fwd+bwd at the benchmark shape (b=8, h=12, d=64, bf16, p=2, gated, through the
public API as bench_attention.py calls it), with its count and total ms, and the wall time beside the kernel sum: what
the small kernels (gate scans, gradient sums, fills) and the gaps between kernels cost.

    python3 scripts/gpu/kernel_list.py --t 65536 [--out DIR]      (writes kernel_list.json into --out)
"""
import argparse
import json
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench_attention import inputs, make_ours, run_once  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--t", type=int, default=65536)
    ap.add_argument("--out", default=os.environ.get("OUT", "runs/kernel_list"))
    args = ap.parse_args()
    call = make_ours(2)
    (q, k, v), lg = inputs(8, args.t, 12, 64, True)
    for _ in range(3):
        run_once(call, q, k, v, lg, True)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run_once(call, q, k, v, lg, True)
    end.record()
    torch.cuda.synchronize()
    wall = start.elapsed_time(end)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run_once(call, q, k, v, lg, True)
        torch.cuda.synchronize()
    rows = sorted(((e.key, e.count, e.device_time_total / 1e3) for e in prof.key_averages() if e.device_time_total > 0),
                  key=lambda r: -r[2])
    total = sum(r[2] for r in rows)
    for name, count, ms in rows:
        print(f"{ms:8.3f} ms  x{count:<3d} {name[:100]}")
    print(f"kernels {total:.3f} ms, wall {wall:.3f} ms (t={args.t})")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "kernel_list.json"), "w") as f:
        json.dump({"t": args.t, "device": torch.cuda.get_device_name(), "wall_ms": wall, "kernel_ms": total,
                   "kernels": [{"name": n, "count": c, "ms": m} for n, c, m in rows]}, f, indent=1)


if __name__ == "__main__":
    main()
