"""Decoding speed, memory and time to first token: power attention's constant-size state against softmax attention's
growing KV cache and RWKV-7's own state (GPT-2 small / RWKV-7 of the same size, random weights, one process).

    python scripts/bench_decode.py --out docs/results          # GPU (bf16 autocast): writes bench_decode.json/.png
    python scripts/bench_decode.py --tiny --out /tmp/bench     # CPU smoke run: tiny models, short prefixes

Rows, each written to the JSON as soon as it is measured (an out-of-memory row is recorded and the run goes on):
- batch 1 at every prefix (default 1k, 4k, 16k, 64k): power p=2, exp (softmax) and RWKV-7 on the static decoder
  (preallocated buffers, one CUDA graph per token, greedy tokens chosen inside the graph: models/decoding.py), and
  power and exp on the eager cached path (`eager`) at the first and last prefix. Power and exp also compiled before
  the capture (CUDA only): `compiled-model` paths compile the whole one-token forward as one graph (what `generate`
  runs by default on CUDA), `compiled` paths each residual block. Power's state step runs two ways, so one run
  compares them: `+fused` paths take the fused Triton kernel (one launch a layer; `compiled-model+fused` is the
  default), the others the plain-torch step (StaticDecoder(fused=False));
- batched decoding (default batch 8 and 64 at a 4k prefix) on each model's first path (its default);
- time to first token at the longest prefix: the prompt through the chunked kernels (power's final state handed to
  the decoder), flash/cuDNN attention (exp), FLA's chunked RWKV-7, timed on a second run (the first compiles);
- `state_step` (CUDA, with power): power's state step alone, GPT-2 small's 12 layers of 12 heads as one CUDA graph,
  microseconds per layer of the fused kernel and of the plain-torch step, at batch 1 and the batched rows' batches,
  and of the fused kernel at each of its tuning knobs (STATE_STEP_VARIANTS: same numbers, other launch shapes).
A prompt of L random tokens runs once (prefill), then `--new-tokens` tokens are decoded greedily, timed with CUDA
synchronization after a few untimed steps (the static decoder's warm-up and graph capture); tokens/s = batch x new
tokens / decoding time. Memory: the bytes the decoding states hold (summed over layers; the KV cache's buffers as
allocated) and the peak allocated memory while decoding. Softmax on its best path here: a static KV cache, fp32
scores from bf16 keys, the values read in blocks side by side (flash decoding), the whole step in a CUDA graph.
A capture that fails is reported in the row (`mode`, `graph_error`), never silent.
`--profile` adds `profile`: power's default path at the first prefix under torch.profiler, each kernel's time per
token (the largest 25) and their total, to show where a token's time goes. `--no-row-gemv` and `--no-tuning`
compile the steps as torch would by default (nn.Linear's cuBLAS GEMV; no coordinate-descent tuning), to measure
what RowLinear and the tuning give; `step_options` records which.
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch
import yaml

from longctx.kernels.bench import require_cuda
from longctx.models import ModelSpec, build_model
from longctx.models.decoding import COMPILE_OPTIONS, StaticDecoder, sample_next
from longctx.plotting import save_figure

CONF = Path(__file__).resolve().parents[1] / "conf"
# name -> (arch, attention, attention parameters)
MODELS = {"power": ("gpt2", "power", {"p": 2}), "exp": ("gpt2", "exp", {}), "rwkv7": ("rwkv7", "linear", {})}
EAGER_MODELS = ("power", "exp")       # also timed on the eager cached path (first and last prefix): before/after
COMPILED_MODELS = ("power", "exp")    # also with each layer's step compiled (StaticDecoder(compile=True), CUDA)
FUSED_MODELS = ("power",)             # also with the fused state-step kernel (`+fused` paths, CUDA)
# StaticDecoder rows (the rest: eager); `compiled-model`: the whole one-token forward as one compiled graph
STATIC_PATHS = ("compiled-model+fused", "compiled+fused", "static+fused", "compiled-model", "compiled", "static")
PATHS = STATIC_PATHS + ("eager",)     # eager: the cached path with no static buffers (EAGER_MODELS only)
UNTIMED_STEPS = 4                     # the static decoder's eager warm-up steps and its capture come first


def state_bytes(obj) -> int:
    """Bytes of every tensor a decoding state holds (PowerState, KVCache, static buffers, tensors, tuples, dicts)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if hasattr(obj, "nbytes") and callable(obj.nbytes):
        return obj.nbytes()
    if isinstance(obj, dict):
        return sum(state_bytes(v) for v in obj.values())
    if isinstance(obj, (tuple, list)):
        return sum(state_bytes(v) for v in obj)
    return 0


def build(name: str, size: str, vocab: int, device: torch.device):
    arch, attention, params = MODELS[name]
    m = yaml.safe_load((CONF / "model" / f"{size}.yaml").read_text())
    spec = ModelSpec(arch=arch, attention=attention, attention_params=params, vocab_size=vocab, d_model=m["d_model"],
                     n_layers=m["n_layers"], n_heads=m["n_heads"], mlp_ratio=m["mlp_ratio"])
    torch.manual_seed(0)
    with device:
        return build_model(spec).eval()


class Timer:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
        self.seconds = time.perf_counter() - self.start


def autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def static_decoder(model, path: str, capacity: int, options: dict | None = None) -> StaticDecoder:
    """A STATIC_PATHS path's static decoder, greedy: each token chosen inside its step's graph, as generate does.
    options: more StaticDecoder arguments (--no-row-gemv, --no-tuning: row_gemv, compile_options)."""
    return StaticDecoder(model, capacity=capacity, compile=path.startswith("compiled"), fused=path.endswith("+fused"),
                         compile_scope="model" if path.startswith("compiled-model") else "blocks", greedy=True,
                         **(options or {}))


@torch.no_grad()
def bench_decode(model, path: str, batch: int, prefix: int, new_tokens: int, device: torch.device,
                 options: dict | None = None) -> dict:
    """One row: prefill a random prompt, then time `new_tokens` greedy steps on `path` ('static' or 'eager')."""
    prompt = torch.randint(0, model.spec.vocab_size, (batch, prefix), device=device)
    row = {"path": path, "batch": batch, "prefix": prefix, "new_tokens": new_tokens}
    with autocast(device):
        if path in STATIC_PATHS:
            decoder = static_decoder(model, path, prefix + UNTIMED_STEPS + new_tokens + 1, options)
            prefill = decoder.prefill

            def decode(nxt, n):  # n greedy steps after nxt (None: after the previous step's own argmax)
                decoder.greedy(n, first=nxt)
        else:
            cache = model.new_cache()
            prefill = lambda ids: model(ids, cache=cache, last_only=True)[:, -1]  # noqa: E731

            def decode(nxt, n):  # sampled on the device: no sync until the end
                for _ in range(n):
                    nxt = sample_next(model(nxt, cache=cache)[:, -1], 0, None)
                return nxt
        with Timer(device) as t:
            logits = prefill(prompt)
        row["prefill_s"] = round(t.seconds, 4)
        nxt = decode(sample_next(logits, 0, None), UNTIMED_STEPS)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        with Timer(device) as t:
            decode(nxt, new_tokens)
    row.update(decode_s=round(t.seconds, 4), tokens_per_s=round(batch * new_tokens / t.seconds, 1),
               ms_per_token=round(1e3 * t.seconds / new_tokens, 3))
    if path in STATIC_PATHS:
        row.update(state_bytes=decoder.state_bytes(), mode=decoder.mode, graph_error=decoder.graph_error,
                   decoder=decoder.describe())
        if path.startswith("compiled"):
            row["compile_error"] = decoder.compile_error
    else:
        row.update(state_bytes=sum(state_bytes(c.state) + state_bytes(c.shift) for c in cache), mode="eager")
    if device.type == "cuda":
        row["peak_decode_bytes"] = torch.cuda.max_memory_allocated()
    return row


@torch.no_grad()
def bench_ttft(model, prefix: int, device: torch.device, repeats: int = 2) -> dict:
    """Time to first token of a batch-1 prompt: prefill (the prompt's states handed to the static decoder) and the
    first token sampled; the last of `repeats` runs (the first compiles and autotunes the kernels)."""
    prompt = torch.randint(0, model.spec.vocab_size, (1, prefix), device=device)
    for _ in range(repeats):
        decoder = StaticDecoder(model, capacity=prefix + 2, compile=False)   # prefill only: nothing to compile
        with autocast(device), Timer(device) as t:
            first = sample_next(decoder.prefill(prompt), 0, None)
        del decoder, first
    return {"path": "prefill", "batch": 1, "prefix": prefix, "ttft_s": round(t.seconds, 4),
            "prefill_tokens_per_s": round(prefix / t.seconds, 1)}


@torch.no_grad()
def profile_step(model, path: str, prefix: int, device: torch.device, tokens: int = 50, top: int = 25,
                 options: dict | None = None) -> dict:
    """Where a decoded token's time goes on `path` at batch 1: torch.profiler over `tokens` greedy steps after the
    warm-up, the self time per token of each CUDA kernel (on CPU: of each op), the `top` largest and the total."""
    from torch.profiler import ProfilerActivity, profile
    cuda = device.type == "cuda"
    prompt = torch.randint(0, model.spec.vocab_size, (1, prefix), device=device)
    with autocast(device):
        decoder = static_decoder(model, path, prefix + UNTIMED_STEPS + tokens + 1, options)
        decoder.greedy(UNTIMED_STEPS, first=sample_next(decoder.prefill(prompt), 0, None))
        with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
            decoder.greedy(tokens)
            if cuda:
                torch.cuda.synchronize(device)

    def self_us(event):
        return event.self_device_time_total if cuda else event.self_cpu_time_total
    events = sorted((e for e in prof.key_averages() if self_us(e) > 0), key=self_us, reverse=True)
    return {"path": path, "prefix": prefix, "tokens": tokens, "decoder": decoder.describe(),
            "total_us_per_token": round(sum(map(self_us, events)) / tokens, 2),
            "kernels": [{"name": e.key, "us_per_token": round(self_us(e) / tokens, 2),
                         "calls_per_token": round(e.count / tokens, 2)} for e in events[:top]]}


STATE_STEP_VARIANTS = {   # the fused kernel's tuning knobs (decode_kernel.power_decode_step_kernel), same numbers
    "state_first": dict(state_first=True), "reduce_chunk16": dict(reduce_chunk=16),
    "state_first+reduce_chunk16": dict(state_first=True, reduce_chunk=16), "block_d64": dict(block_d=64)}


def graph_us_per_call(steps, calls: int, device: torch.device, replays: int) -> float:
    """Microseconds per call of `steps` (which makes `calls` calls), captured once as a CUDA graph and replayed."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        steps()                                               # compiles the kernels outside the capture
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        steps()
    graph.replay()
    with Timer(device) as t:
        for _ in range(replays):
            graph.replay()
    del graph
    return round(1e6 * t.seconds / replays / calls, 2)


@torch.no_grad()
def bench_state_step(batch: int, device: torch.device, p: int = 2, heads: int = 12, d: int = 64, layers: int = 12,
                     replays: int = 200, variants: bool = True) -> dict:
    """Power's state step alone, as GPT-2 small runs it (12 layers of 12 heads, d=64, bf16 q/k/v, fp32 state, gated):
    microseconds per layer of the fused kernel and of the plain-torch step, each as one CUDA graph of `layers`
    steps replayed `replays` times (the graph's launch gaps included, nothing else of the model); with variants, the
    fused kernel at each of STATE_STEP_VARIANTS' tuning knobs too (`fused_variants_us_per_layer`)."""
    from longctx.kernels import power_decode_step, symmetric_power_indices
    from longctx.kernels.power.decode_kernel import power_decode_step_kernel
    index, weight = symmetric_power_indices(p, d, device)
    index = index.int()                                       # as StaticPowerState keeps it
    states = [(torch.zeros(batch, heads, index.shape[1], d, device=device),
               torch.zeros(batch, heads, index.shape[1], device=device),
               torch.zeros(batch * heads, dtype=torch.int32, device=device)) for _ in range(layers)]
    q, k, v = (torch.randn(batch, 1, heads, d, device=device, dtype=torch.bfloat16) for _ in range(3))
    gate = (torch.randn(batch, 1, 768, device=device), 0.02 * torch.randn(heads, 768, device=device),
            torch.full((heads,), 6.9, device=device))
    row = {"path": "state-step", "batch": batch, "p": p, "layers": layers}
    for fused in (True, False):
        def steps():
            for s, z, ticket in states:
                power_decode_step(s, z, index, weight, ticket, q, k, v, None, p, p % 2 == 0, d ** -0.5,
                                  fused=fused, gate=gate)
        row["fused_us_per_layer" if fused else "plain_us_per_layer"] = graph_us_per_call(steps, layers, device,
                                                                                         replays)
    if variants:
        row["fused_variants_us_per_layer"] = {}
        for name, knobs in STATE_STEP_VARIANTS.items():
            def steps():
                for s, z, ticket in states:
                    power_decode_step_kernel(s, z, index, weight, ticket, q, k, v, None, p, p % 2 == 0, d ** -0.5,
                                             gate=gate, **knobs)
            row["fused_variants_us_per_layer"][name] = graph_us_per_call(steps, layers, device, replays)
    return row


def model_rows(result: dict) -> dict:
    """result["models"]; a record of the earlier layout (`attentions`: batch-1 rows of the eager cached path) as
    the same rows, so its figure can be redrawn."""
    if "models" in result:
        return result["models"]
    return {name: [dict(r, path="eager", batch=1) for r in rows] for name, rows in result["attentions"].items()}


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_speed, ax_mem) = plt.subplots(1, 2, figsize=(13, 4.6), gridspec_kw={"width_ratios": [1.5, 1]})
    shades = {"power": plt.cm.Blues, "exp": plt.cm.Oranges, "rwkv7": plt.cm.Greens}   # a family of colors a model
    for name, rows in model_rows(result).items():
        memory_drawn = False
        drawn = [p for p in (*STATIC_PATHS, "eager")
                 if any(r.get("path") == p and r.get("batch") == 1 and "tokens_per_s" in r for r in rows)]
        for i, p in enumerate(drawn):
            ok = [r for r in rows if r.get("path") == p and r.get("batch") == 1 and "tokens_per_s" in r]
            xs = [r["prefix"] for r in ok]
            color = shades.get(name, plt.cm.Greys)(0.9 - 0.55 * i / max(1, len(drawn) - 1))
            ax_speed.plot(xs, [r["tokens_per_s"] for r in ok], marker="o", color=color,
                          ls=":" if p == "eager" else "--" if "fused" not in p and name in FUSED_MODELS else "-",
                          label=f"{name} ({p})")
            if not memory_drawn:  # the same state on every path
                ax_mem.plot(xs, [r["state_bytes"] / 2 ** 20 for r in ok], marker="o", color=color,
                            label=f"{name}: decoding state")
                memory_drawn = True
    for ax in (ax_speed, ax_mem):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("prefix length (tokens, log scale)")
        ax.grid(alpha=0.3, which="both")
    ax_speed.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax_mem.legend(fontsize=8)
    ax_speed.set_yscale("log")
    ax_speed.set_ylabel("decoding speed (tokens/s, batch 1, log scale)")
    ax_mem.set_yscale("log")
    ax_mem.set_ylabel("decoding state (MiB, log scale)")
    names = {"power": "power p=2 (constant state)", "exp": "exp (KV cache)", "rwkv7": "RWKV-7"}
    measured = [m for m, rows in model_rows(result).items() if any("tokens_per_s" in r for r in rows)]
    shown = ", ".join(names.get(m, m) for m in measured)  # a model whose rows were all skipped is not named
    fig.suptitle(f"Decoding after a prefix, {result['model']} models: {shown}, {result['device']}", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)


def summary(result: dict) -> dict:
    """Power's speed over softmax's at the longest prefix (batch 1, each on its fastest path), power's fastest path
    over its plain-torch static and compiled steps, and the TTFTs."""
    def pick(name, path):
        rows = [r for r in result["models"].get(name, []) if r.get("path") == path and r.get("batch") == 1
                and r.get("prefix") == result["prefixes"][-1] and "error" not in r]
        return rows[0] if rows else None
    out = {}
    def best(name):
        return max((r for r in (pick(name, path) for path in STATIC_PATHS) if r), key=lambda r: r["tokens_per_s"],
                   default=None)
    power, exp = best("power"), best("exp")
    if power and exp:
        out["power_path"], out["exp_path"] = power["path"], exp["path"]
        out["power_over_exp_tokens_per_s"] = round(power["tokens_per_s"] / exp["tokens_per_s"], 3)
    for old in ("static", "compiled"):
        before = pick("power", old)
        if power and before and power["path"] != old:
            out[f"power_best_over_{old}"] = round(power["tokens_per_s"] / before["tokens_per_s"], 3)
    for name in result["models"]:
        ttft = pick(name, "prefill")
        if ttft:
            out[f"{name}_ttft_s"] = ttft["ttft_s"]
    return out


def plan_rows(names, paths, prefixes, batches, batch_prefix, cuda: bool, compiled: bool) -> list[tuple]:
    """(model, path, batch, prefix) of every row, the rows that matter most first (--budget-s skips from the end),
    across models: each model's default path and its candidates for fastest (compiled paths, power's with the fused
    kernel) at every prefix, so the headline ratio is measured before anything else; then the TTFTs, the batched
    rows on each model's default path, the other paths, and the eager rows."""
    tiers = [[] for _ in range(5)]
    for name in names:
        fast = [p for p in STATIC_PATHS if p in paths
                and (compiled and name in COMPILED_MODELS or not p.startswith("compiled"))
                and (cuda and name in FUSED_MODELS or not p.endswith("+fused"))] or ["static"]
        for path in fast:
            headline = path == fast[0] or path.startswith("compiled") and (
                path.endswith("+fused") or name not in FUSED_MODELS)
            tiers[0 if headline else 3] += [(name, path, 1, p) for p in prefixes]
        tiers[1].append((name, "prefill", 1, prefixes[-1]))
        tiers[2] += [(name, fast[0], b, batch_prefix) for b in batches]
        if "eager" in paths and name in EAGER_MODELS:
            tiers[4] += [(name, "eager", 1, p) for p in sorted({prefixes[0], prefixes[-1]})]
    return [row for tier in tiers for row in tier]


def parse_ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise SystemExit(f"error: {flag}={text!r}: expected comma-separated positive integers")
    return values


def parse_device(name: str) -> torch.device:
    """--device: auto (CUDA when there is one), cpu, cuda or cuda:N; a CUDA device must exist."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        print(f"error: --device={name!r}: expected auto, cpu, cuda or cuda:N", file=sys.stderr)
        raise SystemExit(2)
    if device.type == "cuda":
        require_cuda(f"--device={name}")
    return device


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for bench_decode.json and bench_decode.png")
    parser.add_argument("--tiny", action="store_true", help="tiny models, prefixes 16-256, CPU-friendly")
    parser.add_argument("--prefixes", help="batch-1 prefix lengths (default 1024,4096,16384,65536; tiny 16,64,256)")
    parser.add_argument("--batches", help="batched rows' batch sizes (default 8,64; tiny 2)")
    parser.add_argument("--batch-prefix", type=int, help="prefix of the batched rows (default 4096; tiny 16)")
    parser.add_argument("--new-tokens", type=int, help="tokens decoded per row (default 128; tiny 4)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"subset of {','.join(MODELS)}")
    parser.add_argument("--budget-s", type=float, default=270.0, help="rows not started by then are skipped")
    parser.add_argument("--no-compile", action="store_true", help="no `compiled` rows (they compile for seconds)")
    parser.add_argument("--paths", help=f"static-decoder paths to time (default: all that apply, among "
                                        f"{','.join(PATHS)}); `+fused` paths apply to power only, eager to "
                                        f"{','.join(EAGER_MODELS)}")
    parser.add_argument("--no-row-gemv", action="store_true",
                        help="compiled steps keep nn.Linear (cuBLAS GEMV) instead of RowLinear")
    parser.add_argument("--no-tuning", action="store_true",
                        help="compiled steps without coordinate-descent tuning (torch's default inductor options)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    parser.add_argument("--profile", action="store_true",
                        help="also profile power's default path at the first prefix: time per token of each kernel")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    device = parse_device(args.device)
    size, vocab = ("tiny", 256) if args.tiny else ("small", 50304)
    prefixes = parse_ints(args.prefixes or ("16,64,256" if args.tiny else "1024,4096,16384,65536"), "--prefixes")
    batches = parse_ints(args.batches or ("2" if args.tiny else "8,64"), "--batches")
    batch_prefix = args.batch_prefix or (16 if args.tiny else 4096)
    new_tokens = args.new_tokens or (4 if args.tiny else 128)
    names = [n for n in args.models.split(",") if n]
    paths = [p for p in (args.paths or ",".join(PATHS)).split(",") if p]
    if not paths or any(p not in PATHS for p in paths):
        raise SystemExit(f"error: --paths={args.paths!r}: expected names among {','.join(PATHS)}")
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        raise SystemExit(f"error: --models={args.models!r}: expected names among {','.join(MODELS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"command": ["python", "scripts/bench_decode.py", *(sys.argv[1:] if argv is None else argv)],
              "model": size, "vocab": vocab, "prefixes": prefixes,
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "dtype": "bf16 autocast" if device.type == "cuda" else "fp32",
              "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "models": {}}
    options = {"row_gemv": not args.no_row_gemv, "compile_options": {} if args.no_tuning else dict(COMPILE_OPTIONS)}
    result["step_options"] = options     # how the compiled rows compile

    def write():
        (out / "bench_decode.json").write_text(json.dumps(result, indent=1) + "\n")

    compiled = device.type == "cuda" and not args.no_compile
    if compiled:  # every model, path and batch compiles the same block code again: room for all of them
        limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
        setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 64))
    plan = plan_rows(names, paths, prefixes, batches, batch_prefix, cuda=device.type == "cuda", compiled=compiled)
    models = {}

    def model_for(name):  # built on first use and kept: the plan moves between models
        if name not in models:
            models[name] = build(name, size, vocab, device)
            with torch.no_grad(), autocast(device):  # warm-up: kernels compiled and autotuned outside the timing
                models[name].generate(torch.zeros(1, 8, dtype=torch.long, device=device), 8, temperature=0,
                                      compile=False)
        return models[name]

    for name in names:
        result["models"][name] = []
    for name, path, batch, prefix in plan:
        rows = result["models"][name]
        if time.perf_counter() - started > args.budget_s:
            rows.append({"path": path, "batch": batch, "prefix": prefix, "error": "skipped: --budget-s spent"})
            continue
        try:
            model = model_for(name)
            if path == "prefill":
                row = bench_ttft(model, prefix, device)
            else:
                row = bench_decode(model, path, batch, prefix, new_tokens, device, options)
        except torch.cuda.OutOfMemoryError:
            row = {"path": path, "batch": batch, "prefix": prefix, "error": "out of memory"}
        rows.append(row)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        print(json.dumps({"model": name, **row}), flush=True)
        result["summary"] = summary(result)
        write()
    write()
    if args.profile and "power" in names:  # a few seconds: run past --budget-s too
        path = next(row[1] for row in plan if row[0] == "power" and row[1] != "prefill")
        result["profile"] = profile_step(model_for("power"), path, prefixes[0], device, options=options)
        print(json.dumps({k: v for k, v in result["profile"].items() if k != "kernels"}), flush=True)
        for kernel in result["profile"]["kernels"]:
            print(f"  {kernel['us_per_token']:9.2f} us/token  {kernel['calls_per_token']:6.2f}/token  "
                  f"{kernel['name'][:100]}", flush=True)
        write()
    models.clear()
    gc.collect()
    if device.type == "cuda" and "power" in names:  # a few seconds: run past --budget-s too
        result["state_step"] = []
        for batch in (1, *batches):   # the fused kernel against the plain-torch step, nothing else of the model
            try:
                result["state_step"].append(bench_state_step(batch, device))
            except torch.cuda.OutOfMemoryError:
                result["state_step"].append({"path": "state-step", "batch": batch, "error": "out of memory"})
            print(json.dumps(result["state_step"][-1]), flush=True)
            write()
    result["seconds"] = round(time.perf_counter() - started, 1)
    write()
    plot(result, out / "bench_decode.png")
    print(json.dumps(result["summary"]))
    print(f"wrote {out / 'bench_decode.json'} and {out / 'bench_decode.png'} in {result['seconds']} s")
    return result


if __name__ == "__main__":
    main()
