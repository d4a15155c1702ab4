"""scripts/bench_decode.py at tiny size on CPU: every row is there and written, power attention's decoding state is
constant in the prefix length while the KV cache of exp grows with it, and bad flags are one line."""
import json
import re
from pathlib import Path

import pytest
import torch

from longctx.kernels import state_dim


def test_bench_decode_tiny(import_script, tmp_path):
    result = import_script("bench_decode").main(["--tiny", "--out", str(tmp_path), "--device", "cpu",
                                                  "--prefixes", "16,40", "--new-tokens", "2"])
    assert (tmp_path / "bench_decode.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "bench_decode.json").read_text()) == result
    assert result["command"][:2] == ["python", "scripts/bench_decode.py"] and result["device"] == "cpu"
    rows = result["models"]
    assert set(rows) == {"power", "exp", "rwkv7"}

    def select(name, path, batch=1):
        return [r for r in rows[name] if r["path"] == path and r["batch"] == batch]
    for name in rows:
        static = select(name, "static")
        assert [r["prefix"] for r in static] == [16, 40]
        assert all(r["mode"] == "eager" and r["graph_error"] is None for r in static)  # CPU: no graphs, no failure
        assert [r["batch"] for r in rows[name] if r["path"] == "static" and r["batch"] > 1] == [2]
        assert [r["prefix"] for r in select(name, "prefill")] == [40] and select(name, "prefill")[0]["ttft_s"] > 0
        assert all(r["tokens_per_s"] > 0 for r in rows[name] if "tokens_per_s" in r)
        assert not any("error" in r for r in rows[name])
    assert [r["prefix"] for r in select("power", "eager")] == [16, 40] and not select("rwkv7", "eager")
    # tiny: 3 layers, 2 heads of 32; PowerState s (D x d) and z (D) per head, fp32: the same at every prefix and path
    power_state = 3 * 2 * state_dim(2, 32) * (32 + 1) * 4
    assert {r["state_bytes"] for r in select("power", "static") + select("power", "eager")} == {power_state}
    assert select("power", "static", batch=2)[0]["state_bytes"] == 2 * power_state
    # RWKV-7: a d x d state per head, plus the two token-shift inputs (d_model each), per layer
    assert {r["state_bytes"] for r in select("rwkv7", "static")} == {3 * (2 * 32 * 32 + 2 * 64) * 4}
    # the static KV cache: keys and values of every position (rounded up to blocks of 256), fp32, 3 layers x 64
    per_position = 3 * 2 * 64 * 4
    for r in select("exp", "static"):
        positions = r["prefix"] + 4 + 2 + 1
        assert r["state_bytes"] == -(-positions // 256) * 256 * per_position
    assert select("exp", "eager")[-1]["state_bytes"] > select("exp", "eager")[0]["state_bytes"]
    assert "power_over_exp_tokens_per_s" in result["summary"] and "power_ttft_s" in result["summary"]


def test_bench_decode_step_options_reach_the_decoders_and_the_record(import_script, tmp_path, monkeypatch):
    """--no-row-gemv / --no-tuning: the record's step_options say how compiled rows compile, and every decoder the
    run builds gets them (row_gemv=False keeps nn.Linear; compile_options {} is torch's default); without the flags
    the decoders' defaults (RowLinear, COMPILE_OPTIONS)."""
    bench = import_script("bench_decode")
    from longctx.models.decoding import COMPILE_OPTIONS
    built = []
    real = bench.StaticDecoder
    monkeypatch.setattr(bench, "StaticDecoder", lambda *a, **kw: built.append(kw) or real(*a, **kw))
    flags = ["--tiny", "--device", "cpu", "--models", "power", "--prefixes", "16", "--new-tokens", "2"]
    for extra, want in (([], {"row_gemv": True, "compile_options": COMPILE_OPTIONS}),
                        (["--no-row-gemv", "--no-tuning"], {"row_gemv": False, "compile_options": {}})):
        built.clear()
        result = bench.main(flags + extra + ["--out", str(tmp_path / str(len(extra)))])
        assert result["step_options"] == want
        static = [kw for kw in built if kw.get("greedy")]   # the timed decoders (the TTFT's is prefill only)
        assert static and all({k: kw[k] for k in want} == want for kw in static)
    decoder = bench.static_decoder(bench.build("power", "tiny", 256, torch.device("cpu")), "compiled-model", 8,
                                   {"row_gemv": False, "compile_options": {}})
    assert decoder.compile_options == {} and not decoder.row_gemv
    assert {type(m) for m in decoder.model.modules() if isinstance(m, torch.nn.Linear)} == {torch.nn.Linear}


def test_bench_decode_plans_the_fused_and_plain_paths(import_script):
    """On CUDA power's batch-1 rows compare six static paths (the fused kernel's and the plain-torch step's, each
    compiled as a whole model, by blocks, and not) at every prefix, exp three, RWKV-7 one. The rows that decide the
    headline come first across models (each model's default path and its compiled candidates for fastest), then the
    TTFTs, the batched rows on each model's default (first) path, the other paths, and the eager rows, only where
    `eager` is among the paths; --paths and --no-compile narrow the list; on CPU one static path each."""
    bench = import_script("bench_decode")
    args = (["power", "exp", "rwkv7"], list(bench.PATHS), [1024, 65536], [8], 4096)
    plan = bench.plan_rows(*args, cuda=True, compiled=True)
    at = (1024, 65536)
    headline = [("power", "compiled-model+fused", 1, x) for x in at] + [("power", "compiled+fused", 1, x) for x in at]
    headline += [("exp", "compiled-model", 1, x) for x in at] + [("exp", "compiled", 1, x) for x in at]
    headline += [("rwkv7", "static", 1, x) for x in at]
    assert plan[:10] == headline
    assert plan[10:16] == [("power", "prefill", 1, 65536), ("exp", "prefill", 1, 65536), ("rwkv7", "prefill", 1, 65536),
                           ("power", "compiled-model+fused", 8, 4096), ("exp", "compiled-model", 8, 4096),
                           ("rwkv7", "static", 8, 4096)]
    others = [(name, path, 1, x) for name, path in [("power", "static+fused"), ("power", "compiled-model"),
                                                    ("power", "compiled"), ("power", "static"), ("exp", "static")]
              for x in at]
    assert plan[16:] == others + [("power", "eager", 1, x) for x in at] + [("exp", "eager", 1, x) for x in at]
    no_compile = bench.plan_rows(*args, cuda=True, compiled=False)
    assert [r[1] for r in no_compile if r[0] == "power" and r[3] == 1024][:2] == ["static+fused", "static"]
    only = bench.plan_rows(["power"], ["compiled+fused", "eager"], [1024], [8], 4096, cuda=True, compiled=True)
    assert [r[1] for r in only] == ["compiled+fused", "prefill", "compiled+fused", "eager"]
    no_eager = bench.plan_rows(["power", "exp"], ["compiled+fused", "compiled"], [1024], [8], 4096, cuda=True,
                               compiled=True)
    assert "eager" not in {r[1] for r in no_eager}
    cpu = bench.plan_rows(*args, cuda=False, compiled=False)
    assert {r[1] for r in cpu} == {"static", "prefill", "eager"}


@pytest.mark.parametrize("flags, words", [(["--prefixes", "16,x"], "--prefixes='16,x'"),
                                          (["--models", "power,gru"], "--models='power,gru'"),
                                          (["--paths", "static,turbo"], "--paths='static,turbo'")])
def test_bench_decode_bad_flags(import_script, tmp_path, flags, words):
    with pytest.raises(SystemExit) as err:
        import_script("bench_decode").main(["--tiny", "--out", str(tmp_path / "o"), "--device", "cpu", *flags])
    assert str(err.value).startswith("error: ") and words in str(err.value)
    assert not (tmp_path / "o" / "bench_decode.json").exists()


def test_bench_decode_redraws_a_record_of_the_earlier_layout(import_script, tmp_path):
    """Records written before the static decoder (`attentions`: batch-1 rows of the eager cached path) still draw."""
    rows = [{"prefix": p, "tokens_per_s": 50.0, "state_bytes": 86_000_000} for p in (1024, 4096)]
    record = {"model": "small", "device": "NVIDIA H200", "attentions": {"power": rows, "exp": rows}}
    import_script("bench_decode").plot(record, tmp_path / "old.png")
    assert (tmp_path / "old.png").stat().st_size > 10_000


ROOT = Path(__file__).resolve().parents[2]


def test_committed_record_is_what_its_figure_and_the_readme_show(import_script, tmp_path, monkeypatch):
    """docs/results/bench_decode.json: every speed line of its figure is the record's batch-1 rows of that model and
    path, and each row of README's decoding table is the record's fastest path per model at that prefix."""
    import matplotlib.pyplot as plt
    bench = import_script("bench_decode")
    record = json.loads((ROOT / "docs" / "results" / "bench_decode.json").read_text())
    kept = []
    monkeypatch.setattr(plt, "close", lambda fig=None: kept.append(fig))
    bench.plot(record, tmp_path / "d.png")
    lines = kept[-1].axes[0].get_lines()
    assert len(lines) >= 10
    for line in lines:
        name, path = line.get_label().rstrip(")").split(" (")
        rows = [r for r in record["models"][name] if r["path"] == path and r["batch"] == 1]
        assert list(zip(line.get_xdata(), line.get_ydata())) == [(r["prefix"], r["tokens_per_s"]) for r in rows]

    def fastest(name, prefix):
        return max(r["tokens_per_s"] for r in record["models"][name]
                   if r["batch"] == 1 and r["prefix"] == prefix and "tokens_per_s" in r and r["path"] != "eager")
    readme = (ROOT / "README.md").read_text().split("### Decoding (H200)")[1].split("![decoding]")[0]
    table = [line.split("|")[1:-1] for line in readme.splitlines() if re.match(r"\| \d+k \|", line)]
    assert [cells[0].strip() for cells in table] == [f"{p // 1024}k" for p in record["prefixes"]]
    number = lambda cell: float(cell.strip(" *x").replace(",", ""))  # noqa: E731
    for cells, prefix in zip(table, record["prefixes"]):
        power, exp, rwkv7 = (fastest(name, prefix) for name in ("power", "exp", "rwkv7"))
        assert [number(cells[i]) for i in (1, 4, 7)] == [round(power), round(exp), round(rwkv7)]
        assert number(cells[8]) == round(power / exp, 2)
    assert number(table[-1][8]) == round(record["summary"]["power_over_exp_tokens_per_s"], 2)


def test_bench_decode_profile_lists_where_a_token_goes(import_script, tmp_path):
    """--profile: power's default path at the first prefix, each op's self time per token (CPU here), largest first,
    none beyond the total; it runs past --budget-s, and the record keeps it."""
    result = import_script("bench_decode").main(["--tiny", "--out", str(tmp_path), "--device", "cpu", "--models",
                                                  "power", "--prefixes", "16", "--new-tokens", "2", "--profile"])
    profile = result["profile"]
    assert profile["path"] == "static" and profile["prefix"] == 16 and profile["tokens"] == 50
    times = [k["us_per_token"] for k in profile["kernels"]]
    assert times == sorted(times, reverse=True) and times[0] > 0 and sum(times) <= profile["total_us_per_token"] + 1
    assert all(k["calls_per_token"] > 0 for k in profile["kernels"])
    assert any("mm" in k["name"] or "linear" in k["name"] for k in profile["kernels"])
    assert json.loads((tmp_path / "bench_decode.json").read_text())["profile"] == profile
