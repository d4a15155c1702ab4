"""scripts/bench_decode.py at tiny size on CPU: it runs, and its memory column shows power attention's decoding
state constant in the prefix length while the KV cache of exp grows with it."""
from longctx.kernels import state_dim


def test_bench_decode_tiny(import_script, tmp_path):
    result = import_script("bench_decode").main(["--tiny", "--out", str(tmp_path), "--device", "cpu",
                                                  "--prefixes", "16,64,256", "--new-tokens", "4"])
    assert (tmp_path / "bench_decode.json").exists() and (tmp_path / "bench_decode.png").stat().st_size > 10_000
    power, exp = result["attentions"]["power"], result["attentions"]["exp"]
    assert [r["prefix"] for r in power] == [r["prefix"] for r in exp] == [16, 64, 256]
    # tiny: 3 layers, 2 heads of 32; PowerState s (D x d) and z (D) per head, fp32
    assert {r["state_bytes"] for r in power} == {3 * 2 * state_dim(2, 32) * (32 + 1) * 4}
    # the KV cache holds keys and values of every position, fp32, 3 layers x d_model 64, in buffers with a
    # quarter (at least 256 positions) of headroom
    per_position = 3 * 2 * 64 * 4
    for r in exp:
        positions = r["prefix"] + 4
        assert positions * per_position <= r["state_bytes"] <= (positions + max(positions // 4, 256)) * per_position
    assert exp[-1]["state_bytes"] > exp[0]["state_bytes"]
    assert all(r["tokens_per_s"] > 0 for r in power + exp)
