"""Device one-off (session 4): chunked vs attention form, fwd+bwd ms, for p=1 (d=64) and p=2 at d=32/128
(b=8, h=12, bf16, gated), through the public API with LONGCTX_POWER_IMPL forcing the form."""
import os
import sys

import torch
from triton.testing import do_bench
from longctx.kernels import power_attention

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_attention import inputs  # noqa: E402  (the benchmark's inputs: same scaling and gates)

b, h = 8, 12
for d, p, norm in ((64, 1, False), (32, 2, True), (128, 2, True)):
    for t in (16384, 65536):
        xs, lg = inputs(b, t, h, d, True)
        for impl in ("chunked", "attention"):
            if impl == "attention" and t == 65536 and d == 128: continue
            os.environ["LONGCTX_POWER_IMPL"] = impl
            def fb():
                y = power_attention(*xs, lg, p=p, norm=norm); y.backward(torch.ones_like(y))
            try:
                fb(); torch.cuda.synchronize()
                ms = do_bench(fb, warmup=2, rep=30, return_mode="median")
                print(f"d={d} p={p} t={t} {impl:9s} fwd+bwd {ms:8.2f} ms", flush=True)
            except Exception as e:
                print(f"d={d} p={p} t={t} {impl} failed {e!r}"[:200], flush=True)
        del xs, lg; torch.cuda.empty_cache()
