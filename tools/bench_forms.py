"""Chunked vs attention form, fwd+bwd ms (median of interleaved rounds), through the public API with
LONGCTX_POWER_IMPL forcing the form (b=8, h=12, bf16, gated). The thresholds of config.dispatch come
from such runs.

    python -m tools.bench_forms --cases 64,2 32,2 128,2 64,1 --ctxs 16384,65536
    python -m tools.bench_forms --cases 64,2 --ctxs 4096,6144,8192 --rounds 3
"""
import argparse
import json
import statistics

import torch
from triton.testing import do_bench

from longctx.kernels.bench import inputs, make_ours, run_once  #  (the benchmark's inputs and harness)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", nargs="+", default=["64,2", "32,2", "128,2", "64,1"], help="d,p pairs")
    ap.add_argument("--ctxs", default="16384,65536")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    b, h = 8, 12
    for case in args.cases:
        d, p = (int(x) for x in case.split(","))
        for t in (int(x) for x in args.ctxs.split(",")):
            xs, lg = inputs(b, t, h, d, True)
            forms = [f for f in ("chunked", "attention") if not (f == "attention" and t >= 65536 and d == 128)]
            times = {f: [] for f in forms}
            for _ in range(args.rounds):          # interleaved: short-t timings drift run to run
                for form in forms:
                    call = make_ours(p, form)
                    try:
                        run_once(call, *xs, lg, True)
                        torch.cuda.synchronize()
                        times[form].append(do_bench(lambda: run_once(call, *xs, lg, True), warmup=5, rep=50,
                                                    return_mode="median"))
                    except Exception as e:  # noqa: BLE001
                        print(f"d={d} p={p} t={t} {form} failed {e!r}"[:200], flush=True)
            for form, ms in times.items():
                if ms:
                    print(json.dumps(dict(d=d, p=p, t=t, form=form, fwd_bwd_ms=round(statistics.median(ms), 4),
                                          rounds=[round(x, 4) for x in ms])), flush=True)
            del xs, lg
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
