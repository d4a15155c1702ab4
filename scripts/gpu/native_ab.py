"""The attention form's C++ node (src/kernels/power/native.py) against its Python node and SDPA cuDNN at short t, in
one process with rounds interleaved: median ms (triton.testing.do_bench over bench_attention's harness: fwd under
no_grad, fwd+bwd with an upstream gradient of ones) and host us per call (n calls, one sync at the end). b=8, h=12,
bf16, gated, p=2, the public API.

    python3 scripts/gpu/native_ab.py --ctxs 1024,2048,4096 --rounds 5 --out $OUT/native
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_attention import inputs, make_ours, make_sdpa, run_once  # noqa: E402
from host_overhead import host_us  # noqa: E402
from longctx.kernels.power import native  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctxs", default="1024,2048,4096")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    t0 = time.time()
    ok = native.wait()
    print(f"native build: {native.status()} in {time.time() - t0:.1f} s", flush=True)
    ours, cudnn = make_ours(2), make_sdpa("cudnn")

    names = ["python", "native", "cudnn"] if ok else ["python", "cudnn"]
    results = {}
    for t in map(int, args.ctxs.split(",")):
        data = {m: inputs(8, t, 12, args.d, m == "fwdbwd") for m in ("fwd", "fwdbwd")}
        for r in range(args.rounds):
            for name in names:
                call = cudnn if name == "cudnn" else ours
                os.environ[native.ENV] = "0" if name == "python" else "1"     # read by each call
                for mode, ((q, k, vv), lg) in data.items():
                    def fn():
                        return run_once(call, q, k, vv, lg, mode == "fwdbwd")
                    fn()
                    fn()                          # the first call per specialization records the plan
                    ms = do_bench(fn, warmup=5, rep=40, return_mode="median")
                    us = host_us(fn)
                    results.setdefault((t, mode, name), []).append((ms, us))
        os.environ.pop(native.ENV, None)
    rows = []
    for (t, mode, name), vals in sorted(results.items()):
        ms = statistics.median(v[0] for v in vals)
        us = statistics.median(v[1] for v in vals)
        row = dict(t=t, mode=mode, impl=name, ms=round(ms, 4), host_us=round(us, 1),
                   ms_rounds=[round(v[0], 4) for v in vals], host_us_rounds=[round(v[1], 1) for v in vals])
        rows.append(row)
        print(json.dumps(row), flush=True)
    for t in sorted({r["t"] for r in rows}):
        for mode in ("fwd", "fwdbwd"):
            by = {r["impl"]: r for r in rows if r["t"] == t and r["mode"] == mode}
            line = "  ".join(f"{n} {by[n]['ms']:.3f} ms / {by[n]['host_us']:.0f} us" for n in names if n in by)
            ratio = by["native" if "native" in by else "python"]["ms"] / by["cudnn"]["ms"]
            print(f"t={t} {mode}: {line}   ours/cudnn {ratio:.2f}x", flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "native_ab.json").write_text(json.dumps(
            dict(device=torch.cuda.get_device_name(), native=native.status(), rows=rows), indent=1))


if __name__ == "__main__":
    main()
