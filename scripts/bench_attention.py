"""Benchmark longctx power attention beside SDPA (cuDNN, flash), power-attention 1.4.4 and its successor retention
1.0.7 (Manifest's Triton kernels, chunk 1024), one process.

Usage (GPU machine; the comparison's wheels installed by tools/setup_device.sh, see docs/gpu.md):
    python scripts/bench_attention.py --out runs/bench            # the headline table: d=64, p=2
    python scripts/bench_attention.py --sweep                     # also d=32/128 and p=1/4
    python scripts/bench_attention.py --chunked 512,1024          # also the chunked form at these chunk sizes
    python scripts/bench_attention.py --chunked 1024 --profile-chunked  # + per-kernel CUDA times (torch.profiler)
Shape: b=8, h=12, bf16, causal, (b, t, h, d) layout; gated power attention (log_g ~ logsigmoid(N(6.9,1))).
Reports median ms (triton.testing.do_bench), tokens/s, TFLOP/s (causal attention FLOPs, FA convention:
fwd 2*b*h*t^2*d, fwd+bwd 3.5x that), peak memory, first-call (compile) seconds, and the card's measured
bf16 matmul rate. Writes bench.json and bench.png (throughput vs context) into --out.
"""
import argparse
import json
import os
import time

import torch
from triton.testing import do_bench

# first-call seconds are part of the table: measure cold autotuning (the device setup keeps winners on disk)
os.environ["TRITON_CACHE_AUTOTUNING"] = "0"

from longctx.kernels.bench import (DEV, inputs, make_ours, make_ours_chunked, make_sdpa, profile,  # noqa: E402
                                   require_cuda, run_once)
from longctx.plotting import save_figure  # noqa: E402


def make_retention(deg):
    def call(q, k, v, lg):
        from retention import power_retention
        t = q.shape[1]
        return power_retention(Q=q, K=k, V=v, log_G=lg, deg=deg, chunk_size=1024 if t > 1024 else None)
    return call


def matmul_tflops():
    a = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    return 2 * 8192 ** 3 / do_bench(lambda: a @ b, warmup=50, rep=200, return_mode="median") / 1e9


def without_skipped(impls: dict, skip: str) -> dict:
    """impls less the comma-separated names of --skip; a name that is not an implementation of this run is an error
    (a misspelled skip would otherwise run, e.g., 1.4.4's minutes of cold autotuning)."""
    names = [n for n in skip.split(",") if n]
    unknown = [n for n in names if n not in impls]
    if unknown:
        raise SystemExit(f"--skip: {', '.join(map(repr, unknown))} not among this run's implementations "
                         f"{sorted(impls)}")
    return {k: v for k, v in impls.items() if k not in names}


def make_public(deg):
    def call(q, k, v, lg):
        from power_attention import power_full
        t = q.shape[1]
        return power_full(q, k, v, lg, deg=deg, chunk_size=1024 if t > 1024 else None)
    return call


def measure(name, call, b, t, h, d, mode, rows, flops_fwd):
    row = dict(impl=name, t=t, b=b, h=h, d=d, mode=mode)
    try:
        (q, k, v), lg = inputs(b, t, h, d, mode != "fwd")

        def fn():
            return run_once(call, q, k, v, lg, mode != "fwd")
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t0 = time.time()
        fn()
        torch.cuda.synchronize()
        row["first_call_s"] = round(time.time() - t0, 2)
        row["peak_mem_gb"] = round((torch.cuda.max_memory_allocated() - base) / 2 ** 30, 3)
        ms = do_bench(fn, warmup=5, rep=40, return_mode="median")
        row["ms"] = round(ms, 3)
        row["mtok_per_s"] = round(b * t / ms / 1e3, 3)
        row["tflops"] = round(flops_fwd * (1 if mode == "fwd" else 3.5) / ms / 1e9, 1)
    except Exception as e:  # noqa: BLE001
        row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
    rows.append(row)
    print(json.dumps(row), flush=True)
    torch.cuda.empty_cache()


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, mode in zip(axes, ("fwd", "fwdbwd")):
        for impl in sorted({r["impl"] for r in rows}):
            pts = sorted((r["t"], r["mtok_per_s"]) for r in rows
                         if r["impl"] == impl and r["mode"] == mode and r["d"] == 64 and "ms" in r)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=impl)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context t")
        ax.set_ylabel("M tokens/s (b=8, h=12, d=64, bf16)")
        ax.set_title(mode)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)


def merged_rows(specs):
    """Rows of several bench.json files ("path" or "path:impl,impl"), later files replacing earlier rows of the same
    impl, t, d and mode."""
    rows = {}
    for spec in specs:
        path, _, names = spec.partition(":")
        keep = set(names.split(",")) if names else None
        for r in json.load(open(path))["rows"]:
            if "ms" in r and (keep is None or r["impl"] in keep):
                rows[r["impl"], r["t"], r["d"], r["mode"]] = r
    return list(rows.values())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "runs/bench"))
    ap.add_argument("--ctxs", default="1024,4096,16384,65536")
    ap.add_argument("--sweep", action="store_true", help="also d=32/128 and p=1/4 at --sweep-ctxs")
    ap.add_argument("--sweep-ctxs", default="4096,16384", help="contexts of --sweep (p=4 runs the quadratic "
                    "attention form: only up to 16k)")
    ap.add_argument("--skip", default="", help="comma-separated impl names to skip")
    ap.add_argument("--chunked", default="", help="comma-separated chunk sizes: also time the Triton chunked "
                    "form (longctx_p2_chunked<C>; with --sweep also d=32/128 and p=1)")
    ap.add_argument("--profile-chunked", action="store_true", help="with --chunked: print per-kernel CUDA time "
                    "of one fwd+bwd of each chunked impl at each context (torch.profiler)")
    ap.add_argument("--keep-autotune", action="store_true", help="keep Triton's autotune winners on disk "
                    "(power-attention 1.4.4's ~460 s at 64k), for tools/keep_autotune.sh; the first-call "
                    "seconds stay cold only on a machine whose cache was not seeded")
    ap.add_argument("--replot", nargs="*", default=None, metavar="JSON[:IMPL,...]",
                    help="no GPU: draw bench.png into --out from earlier bench.json files (the rows of the named impls "
                         "only, if given; a later file's row replaces an earlier one's of the same impl, t, d, mode)")
    args = ap.parse_args()
    if args.replot is not None:
        os.makedirs(args.out, exist_ok=True)
        plot(merged_rows(args.replot), os.path.join(args.out, "bench.png"))
        return
    require_cuda("bench_attention.py (without --replot)")
    if args.keep_autotune:
        os.environ["TRITON_CACHE_AUTOTUNING"] = "1"
    os.makedirs(args.out, exist_ok=True)
    prop = torch.cuda.get_device_properties(0)
    import triton
    from longctx.kernels.power.native import launcher as native
    native.wait()   # short sequences time the C++ node where it builds; the record says whether it did
    env = dict(gpu=prop.name, torch=torch.__version__, triton=triton.__version__,
               matmul_tflops=round(matmul_tflops()), native_launcher=native.status())
    print(json.dumps(env), flush=True)
    b, h, rows = 8, 12, []
    impls = {"sdpa_cudnn": make_sdpa("cudnn"), "sdpa_flash": make_sdpa("flash"),
             "power_attention_1.4.4_p2": make_public(2), "retention_1.0.7_p2": make_retention(2),
             "longctx_p2": make_ours(2),
             "longctx_p2_attention": make_ours(2, "attention")}
    chunks = [int(c) for c in args.chunked.split(",") if c]
    impls.update({f"longctx_p2_chunked{c}": make_ours_chunked(2, c) for c in chunks})
    impls = without_skipped(impls, args.skip)
    jobs = [(name, call, t, 64) for t in map(int, args.ctxs.split(",")) for name, call in impls.items()]
    if args.sweep:
        for t in map(int, args.sweep_ctxs.split(",")):
            jobs += [("sdpa_cudnn", impls.get("sdpa_cudnn", make_sdpa("cudnn")), t, d) for d in (32, 128)]
            jobs += [("longctx_p2", make_ours(2), t, d) for d in (32, 128)]
            jobs += [(f"longctx_p{p}", make_ours(p), t, 64) for p in (1, 4) if p < 4 or t <= 16384]
            for c in chunks:
                jobs += [(f"longctx_p2_chunked{c}", make_ours_chunked(2, c), t, d) for d in (32, 128)]
                jobs += [(f"longctx_p1_chunked{c}", make_ours_chunked(1, c), t, 64)]
    for name, call, t, d in jobs:
        for mode in ("fwd", "fwdbwd"):
            measure(name, call, b, t, h, d, mode, rows, flops_fwd=2 * b * h * t * t * d)
            json.dump(dict(env=env, rows=rows), open(os.path.join(args.out, "bench.json"), "w"), indent=1)
    if args.profile_chunked:
        for name, call, t, d in jobs:
            if "chunked" in name:
                profile(name, call, b, t, h, d)
    plot(rows, os.path.join(args.out, "bench.png"))
    print("TABLE", flush=True)
    for r in rows:
        print(f'{r["impl"]:26s} d={r["d"]:3d} t={r["t"]:6d} {r["mode"]:7s} '
              + (f'{r["ms"]:9.3f} ms {r["mtok_per_s"]:8.2f} Mtok/s {r["tflops"]:6.1f} TF/s '
                 f'{r["peak_mem_gb"]:6.2f} GB first {r["first_call_s"]:5.1f}s' if "ms" in r
                 else r.get("error", "?")[:100]), flush=True)


if __name__ == "__main__":
    main()
