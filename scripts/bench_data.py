#!/usr/bin/env python
"""Benchmark the LongCrawl64 reader: tokens/s delivered and peak memory, 1 and N simulated ranks.

Generates (once) a local zarr array in LongCrawl64's layout — `[num_docs, doc_len]` uint16, zarr format
v2, Blosc(lz4, shuffle) chunks of 2048 x 2048 as zarr 2 wrote them — filled with Zipf-distributed GPT-2
ids (roughly text-like compressibility), then times the reader in a fresh subprocess per configuration:

  * world_size=1: the one rank's batches `(32, 65536)`;
  * world_size=8, one rank: what each DDP process sees (its `(4, 65536)` share, decoding whole chunks);
  * world_size=8, all ranks in one process: the aggregate the machine delivers with every rank on it.

    python scripts/bench_data.py                        # 4096 docs x 65536 (512 MiB of tokens, 2 chunk-rows)
    python scripts/bench_data.py --num-docs 16384       # 2 GiB
    python scripts/bench_data.py --num-docs 32768       # 4 GiB
    python scripts/bench_data.py --data /path/to/longcrawl64/train.zarr   # a real array instead

Each configuration reads `--batches` batches per rank (default: one epoch, so every chunk is decoded)
with nothing else running, i.e. the reader's maximum delivery rate; `--step-ms` adds a simulated
training step per batch to check that block reads hide behind compute (`max_wait_after_first_s` ~0).
Prints one JSON line per configuration: tokens/s over all batches (first block included), first-batch
latency, the longest wait for a later batch, peak RSS.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path


def generate(path: Path, num_docs: int, doc_len: int, chunk: int, seed: int = 0) -> None:
    import numcodecs
    import numpy as np
    import zarr
    from tqdm.auto import tqdm

    rng = np.random.default_rng(seed)
    vocab = 50257
    p = 1.0 / np.arange(1, vocab + 1) ** 1.1
    cdf = np.cumsum(p / p.sum())
    pool = np.minimum(np.searchsorted(cdf, rng.random(1 << 24)), vocab - 1).astype(np.uint16)
    tmp = path.with_name(path.name + ".tmp")
    arr = zarr.create_array(str(tmp), shape=(num_docs, doc_len), chunks=(chunk, chunk), dtype="uint16",
                            zarr_format=2, compressors=numcodecs.Blosc(cname="lz4", clevel=5, shuffle=1),
                            attributes={"bos_id": 50256, "vocab_size": 50257, "rolled": True,
                                        "generator": {"name": "bench_zipf", "seed": seed}}, overwrite=True)
    for lo in tqdm(range(0, num_docs, chunk), desc=f"writing {path.name}", unit="chunk-row"):
        hi = min(num_docs, lo + chunk)
        starts = rng.integers(0, len(pool) - doc_len, size=hi - lo)
        arr[lo:hi] = np.stack([pool[s:s + doc_len] for s in starts])
    os.replace(tmp, path)


def measure(path: str, ctx: int, docs: int, world_size: int, ranks: list[int], batches: int,
            step_ms: float) -> dict:
    import torch
    from longctx.data import LongCrawl64

    torch.set_num_threads(1)
    readers = [LongCrawl64(path, ctx, docs, rank=r, world_size=world_size) for r in ranks]
    iters = [iter(r) for r in readers]
    batches = batches or len(readers[0])
    tokens, max_wait = 0, 0.0
    t0 = time.perf_counter()
    for k in range(batches):
        for it in iters:
            tw = time.perf_counter()
            b = next(it)
            if k > 0:
                max_wait = max(max_wait, time.perf_counter() - tw)
            tokens += b["targets"].numel()
        if k == 0:
            first = time.perf_counter() - t0
        if step_ms:
            time.sleep(step_ms / 1000)  # the trainer's step: the reader works in the background meanwhile
    dt = time.perf_counter() - t0
    for r in readers:
        r.close()
    return {"world_size": world_size, "ranks_in_process": len(ranks), "ctx": ctx, "docs_per_batch": docs,
            "batches_per_rank": batches, "num_docs": readers[0].num_docs, "tokens": tokens, "seconds": round(dt, 3),
            "tokens_per_s": round(tokens / dt), "tokens_per_s_per_rank": round(tokens / dt / len(ranks)),
            "first_batch_s": round(first, 3), "max_wait_after_first_s": round(max_wait, 4), "step_ms": step_ms,
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, help="an existing [N, doc_len] zarr array to read instead")
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/longctx/bench"), help="where to generate")
    ap.add_argument("--num-docs", type=int, default=4096)
    ap.add_argument("--doc-len", type=int, default=65536)
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--ctx", type=int, default=65536)
    ap.add_argument("--docs-per-batch", type=int, default=32)
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--batches", type=int, default=0, help="batches per rank to time (0 = one epoch)")
    ap.add_argument("--step-ms", type=float, default=0.0,
                    help="simulated training step per batch (ms); >0 shows whether reads hide behind compute")
    ap.add_argument("--_measure", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args._measure:  # child process: one configuration, clean peak-RSS
        world_size, ranks = json.loads(args._measure)
        print(json.dumps(measure(args.data, args.ctx, args.docs_per_batch, world_size, ranks, args.batches,
                                 args.step_ms)))
        return

    path = args.data
    if path is None:
        p = Path(args.cache) / f"lc64_zipf_{args.num_docs}x{args.doc_len}_c{args.chunk}.zarr"
        if not p.exists():
            p.parent.mkdir(parents=True, exist_ok=True)
            generate(p, args.num_docs, args.doc_len, args.chunk)
        path = str(p)
    W = args.world_size
    configs = [(1, [0]), (W, [0]), (W, list(range(W)))]
    print(f"# {path}  ctx={args.ctx} docs_per_batch={args.docs_per_batch}  cpus={os.cpu_count()}", flush=True)
    for world_size, ranks in configs:
        cmd = [sys.executable, __file__, "--data", path, "--ctx", str(args.ctx), "--docs-per-batch",
               str(args.docs_per_batch), "--batches", str(args.batches), "--step-ms", str(args.step_ms),
               "--_measure", json.dumps([world_size, ranks])]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        print(out, flush=True)


if __name__ == "__main__":
    main()
