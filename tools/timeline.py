"""The GPU timeline of one p=2 fwd+bwd through the public API (b=8, h=12, d=64, bf16, gated), with the backward's
streams as they run by default: every kernel's stream, start and duration from the profiler's trace, and what that
says about overlap. The per-kernel profiles (tune_sym2.py) run the backward on one stream so that their times compare;
this answers the other question: do the streams overlap kernels, where does the GPU idle, which kernels run beside
which.

    python -m tools.timeline --t 65536 --out DIR     (timeline.json and timeline.png in DIR)

Prints: the span (first kernel start to last kernel end), the union of kernel intervals (GPU busy), the sum of kernel
durations (> union where kernels overlap), each stream's busy time, the idle gaps, and per kernel its time and how
much of it ran beside a kernel of another stream.
"""
import argparse
import collections
import json
import os
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

from longctx.kernels.bench import inputs, make_ours, run_once


def kernel_events(trace_path: str) -> list[dict]:
    """Kernels of a chrome trace from torch.profiler: name, stream, start and end in µs, sorted by start."""
    with open(trace_path) as f:
        trace = json.load(f)
    out = [{"name": e["name"], "stream": e.get("args", {}).get("stream", -1), "start": float(e["ts"]),
            "end": float(e["ts"]) + float(e["dur"])}
           for e in trace.get("traceEvents", []) if e.get("cat") == "kernel" and "dur" in e]
    return sorted(out, key=lambda e: e["start"])


def union_length(intervals) -> float:
    """Total length of the union of (start, end) intervals."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0.0)


def summarize(events: list[dict], min_gap_us: float = 5.0) -> dict:
    """Span, busy union, kernel sum, per-stream busy, idle gaps and, per kernel name, its total time and the part of
    it that overlapped a kernel of another stream."""
    t0 = events[0]["start"]
    span = max(e["end"] for e in events) - t0
    busy = union_length([(e["start"], e["end"]) for e in events])
    streams = collections.defaultdict(list)
    for e in events:
        streams[e["stream"]].append((e["start"], e["end"]))
    gaps, reach = [], events[0]["end"]
    for e in events[1:]:
        if e["start"] - reach > min_gap_us:
            gaps.append({"at_us": reach - t0, "us": e["start"] - reach, "before": e["name"][:60]})
        reach = max(reach, e["end"])
    per = collections.OrderedDict()
    for e in events:
        others = [(max(e["start"], o["start"]), min(e["end"], o["end"])) for o in events
                  if o["stream"] != e["stream"] and o["start"] < e["end"] and o["end"] > e["start"]]
        beside = union_length(others)
        row = per.setdefault(e["name"][:60], {"us": 0.0, "beside_us": 0.0, "count": 0, "stream": e["stream"]})
        row["us"] += e["end"] - e["start"]
        row["beside_us"] += beside
        row["count"] += 1
    return {"span_ms": span / 1e3, "busy_ms": busy / 1e3,
            "kernel_sum_ms": sum(e["end"] - e["start"] for e in events) / 1e3,
            "streams_ms": {str(s): union_length(iv) / 1e3 for s, iv in streams.items()},
            "gaps": gaps, "kernels": per}


def plot(events: list[dict], path: str, title: str):
    """One row per stream, one bar per kernel, colored by kernel name."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t0 = events[0]["start"]
    names = list(dict.fromkeys(e["name"][:40] for e in events))
    cmap = plt.get_cmap("tab20")
    color = {n: cmap(i % 20) for i, n in enumerate(names)}
    rows = {s: i for i, s in enumerate(sorted({e["stream"] for e in events}))}
    fig, ax = plt.subplots(figsize=(14, 1.2 + 0.6 * len(rows)))
    for e in events:
        ax.broken_barh([((e["start"] - t0) / 1e3, (e["end"] - e["start"]) / 1e3)], (rows[e["stream"]] - 0.4, 0.8),
                       color=color[e["name"][:40]])
    ax.set_yticks(list(rows.values()), [f"stream {s}" for s in rows])
    ax.set_xlabel("ms")
    ax.set_title(title)
    handles = [matplotlib.patches.Patch(color=color[n], label=n) for n in names[:20]]
    ax.legend(handles=handles, fontsize=6, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.35))
    fig.savefig(path, dpi=120, bbox_inches="tight")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--t", type=int, default=65536)
    ap.add_argument("--out", default=os.environ.get("OUT", "runs/timeline"))
    ap.add_argument("--fwd", action="store_true", help="the forward alone (no_grad)")
    args = ap.parse_args()
    call = make_ours(2)
    xs, lg = inputs(8, args.t, 12, 64, not args.fwd)
    for _ in range(3):                                    # compile, autotune, warm the caches
        run_once(call, *xs, lg, not args.fwd)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run_once(call, *xs, lg, not args.fwd)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(trace)
        events = kernel_events(trace)
    res = summarize(events)
    mode = "fwd" if args.fwd else "fwd+bwd"
    print(f"t={args.t} {mode}: span {res['span_ms']:.3f} ms, GPU busy {res['busy_ms']:.3f}, kernel sum "
          f"{res['kernel_sum_ms']:.3f}, streams {json.dumps({k: round(v, 3) for k, v in res['streams_ms'].items()})}")
    print(f"idle gaps > 5 us: {len(res['gaps'])}, {sum(g['us'] for g in res['gaps']) / 1e3:.3f} ms in all")
    for name, row in sorted(res["kernels"].items(), key=lambda kv: -kv[1]["us"]):
        print(f"  {row['us'] / 1e3:8.3f} ms  x{row['count']:<3} stream {row['stream']:<3} beside another stream "
              f"{row['beside_us'] / 1e3:7.3f} ms  {name}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "timeline.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "t": args.t, "mode": mode, "summary": res,
                   "events": events}, f, indent=1)
    plot(events, os.path.join(args.out, "timeline.png"),
         f"power attention p=2, t={args.t}, {mode} ({torch.cuda.get_device_name()})")


if __name__ == "__main__":
    main()
