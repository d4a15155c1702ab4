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
