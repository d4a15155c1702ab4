"""Decoding step variants side by side on one GPU (scripts/bench_decode.py's rows, one path each): the compiled
one-token step with and without coordinate-descent tuning (models/decoding.COMPILE_OPTIONS) and the one-row mm
form of the linear layers (RowLinear), for power at a short prefix and softmax at a long one; then power's fastest
variant under the profiler.

    python tools/decode_probe.py --out OUT [--prefix-power 1024] [--prefix-exp 65536]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import bench_decode as bd  # noqa: E402

from longctx.models import decoding  # noqa: E402

TUNED = {"coordinate_descent_tuning": True}
VARIANTS = {"cublas": (False, {}), "tuned+row-mm": (True, TUNED), "tuned": (False, TUNED)}


def use_variant(name: str) -> None:
    row_gemv, options = VARIANTS[name]
    decoding.COMPILE_OPTIONS = options
    bd.static_decoder = lambda model, path, capacity: decoding.StaticDecoder(
        model, capacity=capacity, compile=True, fused=path.endswith("+fused"), greedy=True, row_gemv=row_gemv)
    torch._dynamo.reset()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--prefix-power", type=int, default=1024)
    parser.add_argument("--prefix-exp", type=int, default=65536)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    torch._dynamo.config.recompile_limit = 64
    rows = []
    plan = [(v, m) for v in args.variants.split(",") for m in ("power", "exp")]
    models = {}
    for variant, name in plan:
        if name not in models:
            models[name] = bd.build(name, "small", 50304, device)
        use_variant(variant)
        path, prefix = ("compiled-model+fused", args.prefix_power) if name == "power" else ("compiled-model",
                                                                                           args.prefix_exp)
        start = time.perf_counter()
        row = bd.bench_decode(models[name], path, 1, prefix, 128, device)
        row.update(model=name, variant=variant, wall_s=round(time.perf_counter() - start, 1))
        rows.append(row)
        print(json.dumps({k: row.get(k) for k in ("model", "variant", "prefix", "tokens_per_s", "ms_per_token",
                                                  "mode", "compile_error", "wall_s")}), flush=True)
        (out / "decode_probe.json").write_text(json.dumps(rows, indent=1))
    best = max((r for r in rows if r["model"] == "power"), key=lambda r: r["tokens_per_s"])
    use_variant(best["variant"])
    prof = bd.profile_step(models["power"], "compiled-model+fused", args.prefix_power, device)
    print(best["variant"], "profile total", prof["total_us_per_token"], "us/token", flush=True)
    for k in prof["kernels"]:
        print(f"  {k['us_per_token']:8.2f} us  {k['calls_per_token']:6.2f}/tok  {k['name'][:110]}", flush=True)
    (out / "decode_probe_profile.json").write_text(json.dumps(prof, indent=1))


if __name__ == "__main__":
    main()
