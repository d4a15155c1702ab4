"""Check and tune the p=2 chunked-form kernels (src/kernels/power/chunk_p2/) on a GPU, one process.

    python -m tools.tune_sym2 --out runs/tune            # correctness, per-kernel times per block config
    python -m tools.tune_sym2 --configs 2,64,8,2 1,64,4,2 --chunks 512,1024,2048 --t 65536

1. correctness: bf16 and fp32 (forced) against the float64 reference (output and every gradient, state in/out);
2. for each variant (--rows: the query backward row-scaled or grouped) and block config (JG, rows, warps, stages),
   applied to the kernels named by --sweep: one fwd+bwd at the benchmark shape (b=8, h=12, d=64, bf16, gated, chunk 1024)
   under torch.profiler -> CUDA ms per kernel and TFLOP/s of its matmul work (the backward on one stream:
   --profile-streams for two, whose kernels overlap); the best config per kernel is then combined and timed
   (do_bench, fwd and fwd+bwd), and chunk sizes are compared. Writes tune_sym2.json and profile.png (ms per
   kernel) into --out.

    python -m tools.tune_sym2 --replot runs/tune/tune_sym2.json   # the plot again, no GPU
"""
import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from longctx.kernels.power.autograd import chunked_form
from longctx.kernels.power.chunk_p2 import config as p2_config
from longctx.kernels.power.reference import PowerState, power_attention_reference, state_dim
from longctx.kernels.bench import inputs  # the benchmark's inputs (same shape, scaling and gates)
from longctx.kernels.power import kernel_index, switches

# the p=2 kernels a swept block applies to (chunk_p2.config.block_override's names -> kernel_index names: Triton's,
# then Gluon's where it has one)
KERNELS = {"outer": ["sym2_outer", "gluon_outer"], "qbwd": ["sym2_qbwd"], "kbwd": ["sym2_kbwd", "gluon_key_dk_rows"],
           "qfwd_rows": ["sym2_qfwd_rows", "gluon_query_fwd_rows"], "kdv_rows": ["sym2_kdv_rows", "gluon_key_dv_rows"],
           "qbwd_rows": ["sym2_qbwd_rows", "gluon_query_bwd_rows"]}
WORK = {"sym2_outer": 2, "gluon_outer": 2, "sym2_qbwd": 1, "sym2_kbwd": 1, "sym2_qfwd_rows": 1,
        "gluon_query_fwd_rows": 1, "sym2_kdv_rows": 1, "gluon_key_dv_rows": 1, "sym2_qbwd_rows": 1,
        "gluon_query_bwd_rows": 1, "gluon_key_dk_rows": 1}
# (state products per kernel, for TF/s; the key backward does dk only, dv is row-scaled)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300)).item()


def check(dtype, force, t=1500, chunk=256, d=64, hq=4, hk=2, seed=0):
    torch.manual_seed(seed)
    with p2_config.override(force=force):
        return _check(dtype, t, chunk, d, hq, hk)


def _check(dtype, t, chunk, d, hq, hk):
    q, k, v = (torch.randn(2, t, h, d, device="cuda", dtype=dtype).requires_grad_() for h in (hq, hk, hk))
    lg = F.logsigmoid(torch.randn(2, t, hk, device="cuda") + 4).requires_grad_()
    D = state_dim(2, d)
    s0 = (torch.randn(2, hk, D, d, device="cuda") * 0.1).requires_grad_()
    z0 = (torch.rand(2, hk, D, device="cuda") * 0.1).requires_grad_()
    leaves = [q, k, v, lg, s0, z0]
    y, st = chunked_form(q, k, v, lg, p=2, scale=d ** -0.5, chunk_size=chunk, norm=True, initial_state=(s0, z0),
                         return_state=True)
    outs = [y, st.s, st.z]
    seeds = [torch.randn_like(o) for o in outs]
    grads = torch.autograd.grad(outs, leaves, seeds)
    ref = [x.detach().double().requires_grad_() for x in leaves]
    ry, rst = power_attention_reference(*ref[:4], p=2, chunk_size=chunk, norm=True,
                                        initial_state=PowerState(*ref[4:]), return_state=True)
    routs = [ry, rst.s, rst.z]
    rgrads = torch.autograd.grad(routs, ref, [s.double() for s in seeds])
    names = ["y", "s", "z", "dq", "dk", "dv", "dlog_g", "ds0", "dz0"]
    errs = [rel(a, b) for a, b in zip(outs + list(grads), routs + list(rgrads))]
    return dict(zip(names, errs))


def fwd_bwd(xs, lg, chunk):
    y = chunked_form(*xs, lg, p=2, scale=xs[0].shape[-1] ** -0.5, chunk_size=chunk, norm=True)
    y.backward(torch.ones_like(y))


def profile_kernels(xs, lg, chunk, streams=False):
    """CUDA ms per kernel name of one fwd+bwd. On one stream (config concurrent_bwd off for the profile, unless
    streams: --profile-streams): with the backward's two streams the kernels overlap and each one's time stretches
    with its neighbours' (a kernel once profiled 0.26 ms faster while fwd+bwd got slower), so per-kernel numbers from
    two settings would not compare. Wall time (the TIME lines, tools/ab_switch.py) keeps the default."""
    from torch.profiler import ProfilerActivity, profile
    with p2_config.override(concurrent_bwd=p2_config.current().concurrent_bwd and streams):
        fwd_bwd(xs, lg, chunk)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fwd_bwd(xs, lg, chunk)
            torch.cuda.synchronize()
    times = {}
    for ev in prof.key_averages():
        name = kernel_index.of_profile(ev.key) or ev.key      # ours by their kernel_index names
        times[name] = times.get(name, 0.0) + ev.device_time_total / 1e3
    return times


# kernel name -> (label, family) for the profile plot; names not listed keep theirs and count as "other"
LABELS = {"gluon_outer": ("outer products (keys + query side)", "state"), "sym2_outer": ("outer products", "state"),
          "sym2_kbwd": ("key dk", "state"), "gluon_key_dk_rows": ("key dk", "state"),
          "gluon_query_bwd_rows": ("query backward", "state"), "sym2_qbwd": ("query backward, grouped", "state"),
          "sym2_qbwd_rows": ("query backward", "state"), "sym2_qfwd_rows": ("query forward", "state"),
          "gluon_query_fwd_rows": ("query forward", "state"), "sym2_kdv_rows": ("key dv", "state"),
          "gluon_key_dv_rows": ("key dv", "state"), "attn_dkdv": ("intra-chunk dk, dv", "attention"),
          "attn_dq": ("intra-chunk dq", "attention"), "attn_fwd": ("intra-chunk forward", "attention"),
          "discumsum": ("state cumsums (fwd + bwd)", "other"), "transpose_heads": ("transposed copies", "other")}


def torch_label(name: str) -> str:
    """A short label for a torch kernel of the profile (fwd_bwd here accumulates the inputs' .grad: that add is
    not ours)."""
    if "CUDAFunctor_add<c10::BFloat16>" in name:
        return "torch add bf16: .grad accumulation (this tool)"
    if "CUDAFunctor_add<float>" in name:
        return "torch add fp32"
    if "FillFunctor" in name:
        return "torch fill (ones_like, zero_)"
    return name[:40]


def label_of(name: str) -> tuple[str, str]:
    """(label, family) of a profiled kernel for the plot (a kernel_index name, or the compiled name older records
    hold): LABELS, else torch_label's and "other"."""
    return LABELS.get(kernel_index.of_profile(name) or name, (torch_label(name), "other"))


def plot_profile(profile: dict, path: str, title: str):
    """Horizontal bars of one fwd+bwd's CUDA ms per kernel (tune_sym2.json's profile_best), colored by family."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = {"state": "tab:blue", "attention": "tab:orange", "other": "tab:gray"}
    rows = []
    for name, ms in profile.items():
        rows.append((ms, *label_of(name)))
    rows.sort()
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(rows) + 1.2))
    ax.barh([r[1] for r in rows], [r[0] for r in rows], color=[colors[r[2]] for r in rows])
    for i, (ms, _, _) in enumerate(rows):
        ax.text(ms, i, f" {ms:.2f}", va="center", fontsize=8)
    ax.set_xlim(0, 1.12 * max(r[0] for r in rows))
    ax.set_xlabel("CUDA ms in one fwd+bwd")
    ax.set_title(f"{title}\n{sum(r[0] for r in rows):.1f} ms in kernels", fontsize=9)
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()],
              labels=["state kernels", "intra-chunk attention", "other"], fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_run(res: dict, path: str):
    """plot_profile of a tune_sym2.json result, its card and shape in the title."""
    sh = res["shape"]
    plot_profile(res["profile_best"], path, f"{res['device']}, t={sh['t']}, b={sh['b']}, h={sh['h']}, d={sh['d']}, "
                 f"chunk {sh['chunk']}")


def replot(paths):
    """--replot: <name>_profile.png beside each saved tune_sym2.json."""
    for path in paths:
        with open(path) as fh:
            res = json.load(fh)
        out = os.path.join(os.path.dirname(path) or ".", os.path.basename(path).replace(".json", "") + "_profile.png")
        plot_run(res, out)
        print("wrote", out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "runs/tune"))
    ap.add_argument("--t", type=int, default=65536)
    ap.add_argument("--b", type=int, default=8)
    ap.add_argument("--h", type=int, default=12)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--chunks", default="", help="comma list: also time these chunk sizes with the best config")
    ap.add_argument("--configs", nargs="*", default=["2,64,8,2", "2,64,4,2", "1,64,4,2", "1,128,8,2", "2,128,8,2",
                                                     "2,32,4,2", "4,64,8,2", "2,64,8,3", "1,64,8,3"])
    ap.add_argument("--sweep", default=",".join(KERNELS),
                    help="comma list of kernels the configs apply to (the others keep chunk_p2.config's tables); a "
                         "config is JG,rows,warps,stages[,maxnreg]")
    ap.add_argument("--rows", nargs="*", default=["default"],
                    help="variants to A/B: 'default', 'grouped' (the query backward grouped) or 'rows' (row-scaled)")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--no-atomic", action="store_true", help="config atomic_rmw off (dq / dk by barrier + "
                    "read-modify-write, the deterministic path)")
    ap.add_argument("--attn-blocks", nargs="*", default=[], help="intra-chunk attention tiles, e.g. "
                    "fwd=128,32,4,3,168 dq=64,64,4,2,128 (the attention config's block_override: "
                    "BM,BN,warps,stages[,maxnreg])")
    ap.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="kernel config fields for this run (longctx.kernels.power.switches), e.g. qbwd_pipe=2 "
                         "qbwd_block=128,8,4 outer_stages=3 (a comma list sets a tuple)")
    ap.add_argument("--profile-streams", action="store_true",
                    help="profile with the backward's two streams (kernel times overlap; default: one stream)")
    ap.add_argument("--replot", nargs="*", default=None, metavar="JSON",
                    help="only draw the profile plot of saved tune_sym2.json files (no GPU)")
    args = ap.parse_args()
    if args.replot is not None:
        return replot(args.replot)
    tiles = {kernel: tuple(int(x) for x in cfg.split(",")) for kernel, cfg in
             (item.split("=") for item in args.attn_blocks)}
    items = args.set + (["atomic_rmw=0"] if args.no_atomic else [])
    try:
        switches.parse(items)                   # a bad --set stops here, named, before any GPU time
    except switches.SwitchError as err:
        ap.error(f"--set: {err}")
    with switches.applied(items, tiles):
        res = tune(args)
    with open(os.path.join(args.out, "tune_sym2.json"), "w") as fh:
        json.dump(res, fh, indent=1)


ROWS_VARIANTS = {"default": {}, "grouped": dict(grouped_qbwd_min_d=0), "rows": dict(grouped_qbwd_min_d=1024)}


def tune(args) -> dict:
    """Checks, the block sweep and the timing of the best blocks, under the caller's switches."""
    os.makedirs(args.out, exist_ok=True)
    res = {"device": torch.cuda.get_device_name(), "shape": vars(args), "check": {}, "configs": {}}
    if not args.no_check:
        for name, dtype, force in (("bf16", torch.bfloat16, False), ("fp32_forced", torch.float32, True)):
            t0 = time.time()
            errs = check(dtype, force)
            res["check"][name] = errs
            print(f"CHECK {name}: " + " ".join(f"{k}={v:.1e}" for k, v in errs.items())
                  + f"  ({time.time() - t0:.1f}s)", flush=True)
    b, t, h, d = args.b, args.t, args.h, args.d
    xs, lg = inputs(b, t, h, d, True)
    state_flops = 2 * b * t * h * state_dim(2, d) * d          # one [tokens x D] x [D x d] product
    sweep = args.sweep.split(",")
    best = {}
    for variant in args.rows:
        if variant not in ROWS_VARIANTS:
            raise SystemExit(f"--rows: {variant!r} is not one of {list(ROWS_VARIANTS)}")
        for cfg in args.configs:
            entry = tuple(int(x) for x in cfg.split(","))        # (JG, rows, warps, stages[, maxnreg])
            tag = f"{cfg} rows={variant}"
            try:
                t0 = time.time()
                # the swept entry also replaces the Gluon outer products' own block ("outer" in block_override)
                with p2_config.override(block_override={k: entry for k in sweep}, **ROWS_VARIANTS[variant]):
                    times = profile_kernels(xs, lg, args.chunk, args.profile_streams)
            except Exception as e:                              # noqa: BLE001 (out of resources etc.)
                print(f"CFG {tag}: failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            row = {k: times[k] for k in WORK if k in times}
            res["configs"][tag] = {"ms": row, "total_ms": sum(times.values()), "wall_s": time.time() - t0}
            print(f"CFG {tag}: total {sum(times.values()):8.2f} ms | " + " ".join(
                f"{k} {v:7.2f} ms ({WORK[k] * state_flops / v / 1e9:5.0f} TF/s)" for k, v in row.items()),
                flush=True)
            for key, names in KERNELS.items():
                present = [n for n in names if n in row]        # the outer product: Triton's or Gluon's
                if key not in sweep or not present:
                    continue
                v = sum(row[n] for n in present)
                if key not in best or v < best[key][1]:
                    best[key] = (cfg, v)
    if not best:
        return res
    best_blocks = {k: tuple(int(x) for x in v[0].split(",")) for k, v in best.items()}
    res["best"] = {k: list(v) for k, v in best_blocks.items()}
    print("BEST", res["best"], flush=True)
    with p2_config.override(block_override=best_blocks):
        times = profile_kernels(xs, lg, args.chunk, args.profile_streams)
        top = sorted(times.items(), key=lambda kv: -kv[1])[:12]
        print("PROFILE best: " + " | ".join(f"{k[:40]} {v:.2f}" for k, v in top), flush=True)
        res["profile_best"] = dict(top)
        plot_run(res, os.path.join(args.out, "profile.png"))
        res["timing"] = {}
        for chunk in [args.chunk] + [int(c) for c in args.chunks.split(",") if c]:
            xs2 = [x.detach() for x in xs]
            f = lambda: chunked_form(*xs2, lg.detach(), p=2, scale=d ** -0.5, chunk_size=chunk, norm=True)  # noqa
            ms_f = do_bench(f, warmup=3, rep=20, return_mode="median")
            ms_fb = do_bench(lambda: fwd_bwd(xs, lg, chunk), warmup=3, rep=20, return_mode="median")
            torch.cuda.reset_peak_memory_stats()
            fwd_bwd(xs, lg, chunk)
            peak = torch.cuda.max_memory_allocated() / 1e9
            res["timing"][chunk] = {"fwd_ms": ms_f, "fwdbwd_ms": ms_fb, "peak_gb": peak}
            print(f"TIME chunk {chunk}: fwd {ms_f:.2f} ms, fwd+bwd {ms_fb:.2f} ms, peak {peak:.2f} GB", flush=True)
    return res


if __name__ == "__main__":
    main()
