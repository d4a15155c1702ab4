"""Where the time of a short power_attention call goes (GPU): per-kernel CUDA times from torch.profiler and the
host wall time per call, for the public API (b=8, h=12, d=64, bf16, gated, p=2) at the given lengths.

    python3 scripts/gpu/profile_attn.py --ctxs 1024,4096
"""
import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_attention import inputs, make_ours, make_sdpa, run_once  # noqa: E402


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
    args = ap.parse_args()
    for t in map(int, args.ctxs.split(",")):
        xs, lg = inputs(8, t, 12, 64, True)
        for name, call in (("ours", make_ours(2)), ("cudnn", make_sdpa("cudnn"))):
            for mode in ("fwd", "fwd+bwd"):
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
                gpu = sum(r[1] for r in rows if not r[0].startswith("aten::") and not r[0].startswith("cuda"))
                print(f"== t={t} {name} {mode}: wall {wall:.3f} ms/call, kernels {gpu:.3f} ms", flush=True)
                for key, ms, cnt in rows[:14]:
                    print(f"   {ms:8.4f} ms  x{cnt}  {key[:90]}", flush=True)


if __name__ == "__main__":
    main()
