"""scripts/bench_attention.py without a GPU: --replot (the plot from saved runs) and the --skip check."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _row(impl, t, ms, mode="fwdbwd"):
    return dict(impl=impl, t=t, b=8, h=12, d=64, mode=mode, ms=ms, mtok_per_s=8 * t / ms / 1e3)


def test_replot_merges_runs_later_rows_replacing_earlier(tmp_path, import_script):
    old = tmp_path / "old.json"
    new = tmp_path / "new.json"
    old.write_text(json.dumps({"env": {}, "rows": [_row("ours", 1024, 2.0), _row("theirs", 1024, 4.0),
                                                   dict(impl="ours", t=4096, d=64, mode="fwd", error="OOM")]}))
    new.write_text(json.dumps({"env": {}, "rows": [_row("ours", 1024, 1.0), _row("ours", 4096, 3.0)]}))
    bench_attention = import_script("bench_attention")
    rows = bench_attention.merged_rows([f"{old}:theirs,ours", str(new)])
    got = sorted((r["impl"], r["t"], r["ms"]) for r in rows)
    assert got == [("ours", 1024, 1.0), ("ours", 4096, 3.0), ("theirs", 1024, 4.0)]    # error rows dropped
    only = bench_attention.merged_rows([f"{old}:theirs"])
    assert [(r["impl"], r["ms"]) for r in only] == [("theirs", 4.0)]

    out = tmp_path / "plot"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_attention.py"), "--out", str(out),
                           "--replot", str(old), str(new)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_skip_names_an_unknown_implementation(import_script):
    bench_attention = import_script("bench_attention")
    impls = {"sdpa_cudnn": 1, "power_attention_1.4.4_p2": 2, "longctx_p2": 3}
    assert bench_attention.without_skipped(impls, "sdpa_cudnn,") == {"power_attention_1.4.4_p2": 2, "longctx_p2": 3}
    assert bench_attention.without_skipped(impls, "") == impls
    with pytest.raises(SystemExit, match="'power_attention'"):
        bench_attention.without_skipped(impls, "sdpa_cudnn,power_attention")


def test_run_once_returns_the_gradients_and_adds_nothing_into_grad():
    """The benchmark's fwd+bwd returns the inputs' gradients (closed form of sum(q * k * v) + 0 * log_g unused) and
    leaves every .grad None: an accumulation into leaves timed one more elementwise add per input and call."""
    import torch

    from longctx.kernels.bench import run_once

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 5, 3, 4, generator=g, dtype=torch.float64).requires_grad_() for _ in range(3))
    lg = torch.randn(2, 5, 3, generator=g, dtype=torch.float64).requires_grad_()
    grads = run_once(lambda q, k, v, lg: q * k * v, q, k, v, lg, True)      # log_g unused, as by softmax
    for got, want in zip(grads, (k * v, q * v, q * k)):
        assert torch.equal(got, want.detach())
    assert grads[3] is None
    assert all(x.grad is None for x in (q, k, v, lg))
    with torch.no_grad():
        want = q * k * v
    assert torch.equal(run_once(lambda q, k, v, lg: q * k * v, q, k, v, lg, False), want)
