"""p=1 (norm=False, d=64, b=8, h=12, bf16, gated): attention form vs chunked form (forced through
LONGCTX_POWER_IMPL) fwd+bwd ms at 1k-8k, to set p=1's routing threshold (dispatch.CHUNKED_MIN_T applies to it now).

    python3 scripts/gpu/p1_forms.py
"""
import json
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_attention import inputs, make_ours, run_once  # noqa: E402

for t in (1024, 2048, 4096, 8192):
    xs, lg = inputs(8, t, 12, 64, True)
    for impl in ("attention", "chunked"):
        call = make_ours(1, impl)
        run_once(call, *xs, lg, True)
        torch.cuda.synchronize()
        ms = do_bench(lambda: run_once(call, *xs, lg, True), warmup=5, rep=40, return_mode="median")
        print(json.dumps(dict(p=1, t=t, impl=impl, fwd_bwd=round(ms, 4))), flush=True)
