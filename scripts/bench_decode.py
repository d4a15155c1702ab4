"""Decoding speed and memory against the prefix length: power attention's constant-size state vs softmax
attention's growing KV cache (GPT-2 small, random weights, batch 1, one process).

    python scripts/bench_decode.py --out docs/results          # GPU: prefixes 1k-64k, writes bench_decode.json/.png
    python scripts/bench_decode.py --tiny --out /tmp/bench     # CPU smoke run: tiny model, short prefixes

For every attention and prefix length L: the prompt of L random tokens runs once through the model with decoding
caches (prefill, timed apart), then `--new-tokens` tokens are decoded one at a time (greedy), timed with CUDA
synchronization; tokens/s = new tokens / decoding time. Memory: the bytes the per-layer decoding states hold after
decoding (summed over layers; the KV cache's buffers as allocated), and on CUDA the peak allocated memory while
decoding. bf16 autocast on CUDA, fp32 on CPU.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from longctx.models import ModelSpec, build_model
from longctx.models.decoding import sample_next

CONF = Path(__file__).resolve().parents[1] / "conf"
ATTENTIONS = {"power": {"p": 2}, "exp": {}}


def state_bytes(obj) -> int:
    """Bytes of every tensor a decoding state holds (PowerState, KVCache, tensors, tuples, dicts)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if hasattr(obj, "nbytes") and callable(obj.nbytes):
        return obj.nbytes()
    if isinstance(obj, dict):
        return sum(state_bytes(v) for v in obj.values())
    if isinstance(obj, (tuple, list)):
        return sum(state_bytes(v) for v in obj)
    return 0


def build(attention: str, size: str, vocab: int, device: torch.device):
    m = OmegaConf.load(CONF / "model" / f"{size}.yaml")
    spec = ModelSpec(attention=attention, attention_params=ATTENTIONS[attention], vocab_size=vocab,
                     d_model=m.d_model, n_layers=m.n_layers, n_heads=m.n_heads, mlp_ratio=m.mlp_ratio)
    torch.manual_seed(0)
    with device:
        return build_model(spec).eval()


@torch.no_grad()
def bench_one(model, prefix: int, new_tokens: int, device: torch.device) -> dict:
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)
    prompt = torch.randint(0, model.spec.vocab_size, (1, prefix), device=device)
    cache = model.new_cache()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    sync()
    t0 = time.perf_counter()
    with amp:
        logits = model(prompt, cache=cache, last_only=True)[:, -1]
    sync()
    prefill_s = time.perf_counter() - t0
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    with amp:
        for _ in range(new_tokens):
            logits = model(sample_next(logits, 0, None), cache=cache)[:, -1]
    sync()
    decode_s = time.perf_counter() - t0
    row = {"prefix": prefix, "new_tokens": new_tokens, "prefill_s": round(prefill_s, 4),
           "decode_s": round(decode_s, 4), "tokens_per_s": round(new_tokens / decode_s, 2),
           "ms_per_token": round(1e3 * decode_s / new_tokens, 3),
           "state_bytes": sum(state_bytes(c.state) for c in cache)}
    if cuda:
        row["peak_decode_bytes"] = torch.cuda.max_memory_allocated()
    del cache
    return row


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_speed, ax_mem) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, rows in result["attentions"].items():
        xs = [r["prefix"] for r in rows]
        ax_speed.plot(xs, [r["tokens_per_s"] for r in rows], marker="o", label=name)
        ax_mem.plot(xs, [r["state_bytes"] / 2 ** 20 for r in rows], marker="o", label=f"{name}: decoding state")
        if rows and "peak_decode_bytes" in rows[0]:
            ax_mem.plot(xs, [r["peak_decode_bytes"] / 2 ** 20 for r in rows], ls="--", marker=".",
                        label=f"{name}: peak allocated while decoding")
    for ax in (ax_speed, ax_mem):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("prefix length (tokens, log scale)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    ax_speed.set_ylabel("decoding speed (tokens/s, batch 1)")
    ax_mem.set_yscale("log")
    ax_mem.set_ylabel("memory (MiB, log scale)")
    fig.suptitle(f"Decoding GPT-2 {result['model']} after a prefix: power p=2 (constant state) vs exp (KV cache), "
                 f"{result['device']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for bench_decode.json and bench_decode.png")
    parser.add_argument("--tiny", action="store_true", help="tiny model, prefixes 16-256, CPU-friendly")
    parser.add_argument("--prefixes", help="comma-separated prefix lengths (default 1k,4k,16k,64k; tiny 16,64,256)")
    parser.add_argument("--new-tokens", type=int, help="tokens decoded per measurement (default 128; tiny 8)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    args = parser.parse_args(argv)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    size, vocab = ("tiny", 256) if args.tiny else ("small", 50304)
    default = "16,64,256" if args.tiny else "1024,4096,16384,65536"
    prefixes = [int(x) for x in (args.prefixes or default).split(",")]
    new_tokens = args.new_tokens or (8 if args.tiny else 128)
    result = {"model": size, "vocab": vocab, "device": torch.cuda.get_device_name(device) if device.type == "cuda"
              else "cpu", "dtype": "bf16 autocast" if device.type == "cuda" else "fp32", "batch": 1,
              "attentions": {}}
    for name in ATTENTIONS:
        model = build(name, size, vocab, device)
        bench_one(model, prefixes[0], 2, device)  # warm-up: kernels compiled and autotuned outside the timing
        rows = []
        for prefix in prefixes:
            rows.append(bench_one(model, prefix, new_tokens, device))
            print(json.dumps({"attention": name, **rows[-1]}), flush=True)
        result["attentions"][name] = rows
        del model
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_decode.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, out / "bench_decode.png")
    print(f"wrote {out / 'bench_decode.json'} and {out / 'bench_decode.png'}")
    return result


if __name__ == "__main__":
    main()
