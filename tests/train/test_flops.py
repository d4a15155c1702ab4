"""FLOP accounting: closed forms for GPT-2 small, the flops script's JSON line, MFU lookup."""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from longctx.train.flops import mfu, peak_bf16_flops

REPO = Path(__file__).resolve().parents[2]


def flops_json(*overrides: str) -> dict:
    """The script as a user runs it: its last stdout line is the JSON object."""
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "flops.py"), *overrides],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "WSFR" in out.stdout
    return json.loads(out.stdout.strip().splitlines()[-1])


def flops_main(*overrides: str) -> dict:
    """The script's main() in-process (no interpreter start-up per configuration)."""
    spec = importlib.util.spec_from_file_location("flops_script", REPO / "scripts" / "flops.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with contextlib.redirect_stdout(io.StringIO()):
        return module.main(list(overrides))


def test_gpt2_small_exp_closed_form():
    d, layers, vocab, ctx = 768, 12, 50304, 1024
    r = flops_json("arch=gpt2", "model=small", "attention=exp", f"ctx={ctx}", "data=longcrawl64")
    # weights: 12 d^2 per layer (qkv 3d^2, out d^2, MLP 8d^2) plus the LM head d*V; 2 FLOPs per multiply-add
    weight_params = layers * 12 * d * d + d * vocab
    assert r["weight_flops_per_token"] == pytest.approx(2 * weight_params, rel=0.01)
    # state: q.K and A.V over the causal average of (ctx + 1) / 2 keys per query
    assert r["state_flops_per_token"] == pytest.approx(layers * 4 * d * (ctx + 1) / 2, rel=0.01)
    assert r["wsfr"] == pytest.approx(r["weight_flops_per_token"] / r["state_flops_per_token"])


def test_the_padded_vocabulary_is_the_trainers_and_its_reason_is_said():
    """GPT-2's 50257 ids are counted as the 50304 the trainer builds (the next multiple of 64, model_vocab_size), and
    the script's --help says why the vocabulary is padded; a small vocabulary (ICL Markov's 5) is not padded."""
    from longctx.models.spec import model_vocab_size

    out = subprocess.run([sys.executable, str(REPO / "scripts" / "flops.py"), "arch=gpt2", "model=small",
                          "attention=exp", "ctx=1024", "data=longcrawl64"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    (vocab,) = [int(line.split()[-1]) for line in out.stdout.splitlines() if line.startswith("vocab ")]
    assert vocab == model_vocab_size(50257) == 50304 == 64 * -(-50257 // 64)
    assert model_vocab_size(5) == 5
    usage = subprocess.run([sys.executable, str(REPO / "scripts" / "flops.py"), "--help"], capture_output=True,
                           text=True, timeout=300).stdout
    assert "padded to 50304" in usage and "multiple of 64" in usage and "tensor-core tiles" in usage


def test_the_vocabulary_is_the_datas_as_the_trainer_builds_it(tmp_path):
    """data=mqar counts its own 2048 + 2048 + 2 ids (padded: 4160), a prepared dataset its recorded vocabulary, as the
    model the trainer builds: both were counted with GPT-2's 50304."""
    import zarr

    from longctx.models.spec import model_vocab_size

    def vocab(*overrides):
        out = subprocess.run([sys.executable, str(REPO / "scripts" / "flops.py"), *overrides], capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        return next(int(line.split()[-1]) for line in out.stdout.splitlines() if line.startswith("vocab "))

    assert vocab("data=mqar", "ctx=512") == model_vocab_size(2048 + 2048 + 2) == 4160
    for split in ("train.zarr", "heldout.zarr"):
        zarr.create_array(str(tmp_path / split), shape=(2, 256), chunks=(2, 256), dtype="uint16",
                          attributes={"bos_id": 8191, "vocab_size": 8192, "max_token_id": 8190})
    assert vocab("data=longcrawl64", f"data.path={tmp_path}") == 8192
    assert vocab("data=longcrawl64") == 50304  # no data.path: GPT-2's


def test_state_flops_scale_with_context_only_for_exp():
    exp = [flops_main("model=small", "attention=exp", f"ctx={c}")["state_flops_per_token"] for c in (1024, 8192)]
    assert exp[1] / exp[0] == pytest.approx(8, rel=0.01)
    lin = [flops_main("model=small", "attention=power", "p=2", f"ctx={c}")["state_flops_per_token"] for c in (1024, 8192)]
    assert lin[0] == lin[1]
    # power p=2, d=64 keeps the kernel's tiled symmetric-power state: D = C(d/t + p - 1, p) t^p with tile
    # t = 8 -> C(9, 2) * 64 = 2304 (the untiled symmetric power would be C(65, 2) = 2080); D x (d + 1) per
    # head (numerator + normalizer), 12 heads, 12 layers
    r = flops_main("model=small", "attention=power", "p=2", "ctx=1024")
    assert r["state_size"] == 12 * 12 * math.comb(9, 2) * 8**2 * 65


def test_mfu_lookup_by_device_name():
    assert peak_bf16_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_bf16_flops("NVIDIA H200") == 989e12
    assert peak_bf16_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_bf16_flops("cpu") is None and mfu(1e6, 1e9, "cpu") is None
    assert mfu(1e5, 1e9, "NVIDIA H100 80GB HBM3") == pytest.approx(1e14 / 989e12)


def test_plot_runs_against_flops(tmp_path):
    for name, scale in (("a", 1.0), ("b", 2.0)):
        run = tmp_path / name
        run.mkdir()
        run.joinpath("metrics.jsonl").write_text("".join(
            json.dumps({"step": s, "tokens": 100 * s, "flops": 1e12 * scale * s, "best_context_loss": 2.0 / s}) + "\n"
            for s in (1, 2, 3)))
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "plot_runs.py"), str(tmp_path / "a"),
                          str(tmp_path / "b"), "-o", str(tmp_path / "cmp.png")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "cmp.png").stat().st_size > 5000
    bad = subprocess.run([sys.executable, str(REPO / "scripts" / "plot_runs.py"), str(tmp_path / "a"),
                          "--y", "nonsense", "-o", str(tmp_path / "x.png")], capture_output=True, text=True)
    assert bad.returncode != 0 and "--y='nonsense'" in bad.stderr


# ----- training FLOPs charged with the form that runs (the kernels' dispatch) -------------------------------

def _core(attention: str, p: int = 2, d_model: int = 256, n_heads: int = 4, chunk_size=None):
    from longctx.models import ModelSpec
    from longctx.models.attention import build_attention
    params = {"p": p, "chunk_size": chunk_size} if attention == "power" else {}
    spec = ModelSpec(attention=attention, attention_params=params, d_model=d_model, n_heads=n_heads, n_layers=1)
    return build_attention(spec)


def _quadratic(h: int, d: int, t: int) -> float:
    """Causal softmax-like attention: q.k and A.v, d multiply-adds each, (t + 1) / 2 keys per query on average."""
    return h * 2 * 2 * d * (t + 1) / 2


def _recurrent(h: int, d: int, D: int, normalized: bool) -> float:
    """State query phi(q).S and update phi(k)^T v: D x (d + normalizer) multiply-adds each per token."""
    return h * 2 * 2 * D * (d + int(normalized))


def test_dispatch_thresholds_pinned():
    """The accounting asks the routing itself (the call's plan); pin the routing it relies on so a changed threshold
    shows here."""
    from longctx.kernels.power import config, plan
    cfg = config.dispatch.current()
    assert plan.cuda_chunk_size(cfg.chunked_min_t - 1, 2, 64, torch.bfloat16) is None
    assert plan.cuda_chunk_size(cfg.chunked_min_t, 2, 64, torch.bfloat16) == cfg.chunk_p2
    assert plan.cuda_chunk_size(cfg.chunked_min_t_aligned, 2, 64, torch.bfloat16) == cfg.chunk_p2
    assert plan.cuda_chunk_size(cfg.chunked_min_t_aligned - cfg.chunk_p2, 2, 64, torch.bfloat16) is None
    assert plan.cuda_chunk_size(65536, 4, 64, torch.bfloat16) is None  # p=4: always the attention form
    assert plan.cuda_chunk_size(cfg.chunked_min_t_linear, 1, 64, torch.bfloat16) == cfg.default_chunk
    assert plan.cuda_chunk_size(65536, 2, 64, torch.float32) is None  # p=2 outside bf16: attention form


@pytest.mark.parametrize("ctx", [1024, 4096, 6143])
def test_power_below_threshold_is_charged_quadratic(ctx):
    from longctx.train.flops import executed_state_flops
    core = _core("power", p=2)
    assert executed_state_flops(core, ctx) == pytest.approx(_quadratic(4, 64, ctx))
    exp = _core("exp")
    assert executed_state_flops(core, ctx) == pytest.approx(exp.state_flops(ctx))  # same work as softmax


@pytest.mark.parametrize("ctx", [6144, 8192, 65536])
def test_power_above_threshold_is_charged_chunked(ctx):
    from longctx.kernels.power import config
    CHUNKED_C_P2 = config.dispatch.current().chunk_p2
    from longctx.train.flops import executed_state_flops
    core = _core("power", p=2)
    D = math.comb(9, 2) * 8 ** 2  # tiled symmetric power, d=64, tile 8
    want = _quadratic(4, 64, CHUNKED_C_P2) + _recurrent(4, 64, D, True)
    assert executed_state_flops(core, ctx) == pytest.approx(want)
    assert executed_state_flops(core, ctx) > core.state_flops(ctx)  # the intra-chunk attention is real work


def test_power_p4_is_quadratic_at_64k_and_cpu_runs_the_reference_forms():
    from longctx.train.flops import executed_state_flops
    assert executed_state_flops(_core("power", p=4), 65536) == pytest.approx(_quadratic(4, 64, 65536))
    D = math.comb(9, 2) * 8 ** 2
    # the CPU reference: the attention form up to 1024 tokens, chunks of 256 above (p <= 2)
    core = _core("power", p=2)
    assert executed_state_flops(core, 1024, device_type="cpu") == pytest.approx(_quadratic(4, 64, 1024))
    assert executed_state_flops(core, 65536, device_type="cpu") == pytest.approx(
        _quadratic(4, 64, 256) + _recurrent(4, 64, D, True))
    # an explicit chunk size is what runs, on any device
    core = _core("power", p=2, chunk_size=256)
    assert executed_state_flops(core, 4096, device_type="cpu") == pytest.approx(
        _quadratic(4, 64, 256) + _recurrent(4, 64, D, True))


def test_linear_and_softmax_forms(monkeypatch):
    """Linear attention on CUDA is charged with the kernel its forward calls: FLA's chunk_simple_gla (chunks of 64,
    a d x d state) where FLA runs, else the p=1 power kernels' forms."""
    from longctx.kernels.power import config
    from longctx.models.attention import linear
    from longctx.train.flops import executed_state_flops
    CHUNKED_DEFAULT_C = config.dispatch.current().default_chunk
    lin = _core("linear")
    monkeypatch.setattr(linear, "_fla_simple_gla_ok", lambda device=None: False)
    assert executed_state_flops(lin, 2048) == pytest.approx(_quadratic(4, 64, 2048))
    assert executed_state_flops(lin, 8192) == pytest.approx(_quadratic(4, 64, CHUNKED_DEFAULT_C)
                                                            + _recurrent(4, 64, 64, False))
    monkeypatch.setattr(linear, "_fla_simple_gla_ok", lambda device=None: True)
    for ctx in (2048, 8192):
        assert executed_state_flops(lin, ctx) == pytest.approx(_quadratic(4, 64, 64) + _recurrent(4, 64, 64, False))
    assert executed_state_flops(lin, 8192, device_type="cpu") == pytest.approx(  # CPU: the p=1 reference, chunks of 256
        _quadratic(4, 64, 256) + _recurrent(4, 64, 64, False))
    win = _core("window")
    assert executed_state_flops(win, 8192) == win.state_flops(8192)


# ----- each core's forward_flops against a closed form, tiny configs (d_model 16, 2 heads of 8) -------------

def _tiny(attention: str, **params):
    from longctx.models import ModelSpec
    from longctx.models.attention import build_attention
    return build_attention(ModelSpec(attention=attention, attention_params=params, d_model=16, n_heads=2, n_layers=1))


@pytest.mark.parametrize("ctx", [1, 7, 100])
def test_exp_forward_flops_closed_form(ctx):
    # every query i (0-based) reads i + 1 keys: sum = ctx (ctx + 1) / 2; q.k and A.v, 8 multiply-adds each, 2 heads
    want = 2 * (2 * 8 + 2 * 8) * sum(i + 1 for i in range(ctx)) / ctx
    assert _tiny("exp").forward_flops(ctx, "cuda") == pytest.approx(want)
    assert _tiny("exp").forward_flops(ctx, "cpu", torch.float32) == pytest.approx(want)


@pytest.mark.parametrize("ctx", [3, 5, 40])
def test_window_forward_flops_closed_form(ctx):
    w = 5
    want = 2 * 32 * sum(min(i + 1, w) for i in range(ctx)) / ctx
    assert _tiny("window", window=w).forward_flops(ctx, "cuda") == pytest.approx(want)


def test_power_forward_flops_closed_forms():
    from longctx.kernels import state_dim
    core = _tiny("power", p=2, chunk_size=4)
    D = state_dim(2, 8)
    # chunks of 4: query i reads (i mod 4) + 1 keys inside its chunk (mean 2.5), plus the state's query and update
    # (D x (8 + 1) multiply-adds each, normalizer included), per head
    ctx = 16
    intra = 2 * 32 * sum(i % 4 + 1 for i in range(ctx)) / ctx
    assert core.forward_flops(ctx, "cuda") == pytest.approx(intra + 2 * 2 * 2 * D * 9)
    assert core.forward_flops(4, "cuda") == pytest.approx(2 * 32 * 2.5)  # one chunk: the attention form
    short = _tiny("power", p=2)
    assert short.forward_flops(100, "cpu") == pytest.approx(2 * 32 * 101 / 2)  # the CPU reference's attention form


def test_linear_forward_flops_closed_form(monkeypatch):
    from longctx.models.attention import linear
    core = _tiny("linear")
    ctx = 1000
    monkeypatch.setattr(linear, "_fla_simple_gla_ok", lambda device=None: True)
    # FLA: chunks of 64 (1000 = 15 x 64 + 40), the d x d state read and written, no normalizer
    intra = 2 * 32 * sum(i % 64 + 1 for i in range(15 * 64)) / (15 * 64)
    assert core.forward_flops(ctx, "cuda") == pytest.approx(intra + 2 * 2 * 2 * 8 * 8)
    monkeypatch.setattr(linear, "_fla_simple_gla_ok", lambda device=None: False)
    assert core.forward_flops(ctx, "cuda") == pytest.approx(2 * 32 * 1001 / 2)  # below p=1's chunked threshold


def test_rwkv7_forward_flops_closed_form():
    from longctx.models import ModelSpec
    from longctx.models.rwkv7 import RWKV7Rule
    rule = RWKV7Rule(ModelSpec(arch="rwkv7", d_model=16, n_heads=2, n_layers=1))
    # a^T S, b (a^T S), k v^T, r^T S over the 8 x 8 state: 4 multiply-adds per entry, the decay 1 multiply; 2 heads
    assert rule.forward_flops(4096, "cuda") == pytest.approx(2 * (4 * 2 + 1) * 64)


def test_training_flops_use_the_executed_form_wsfr_the_architecture_count():
    from longctx.models import ModelSpec, build_model
    from longctx.train.flops import flops_report
    with torch.device("meta"):
        model = build_model(ModelSpec(attention="power", attention_params={"p": 2}, d_model=256, n_heads=4, n_layers=2, vocab_size=65,
                                      ctx=4096))
    r = flops_report(model, 4096)
    assert r["executed_state_flops_per_token"] == pytest.approx(2 * _quadratic(4, 64, 4096))
    assert r["train_flops_per_token"] == pytest.approx(3 * (r["weight_flops_per_token"]
                                                            + r["executed_state_flops_per_token"]))
    assert r["wsfr"] == pytest.approx(r["weight_flops_per_token"] / r["state_flops_per_token"])


def test_flops_script_prints_both_wsfr_definitions_and_readme_uses_the_one_without_the_lm_head():
    """The script labels both ratios (with the LM head's weight FLOPs, without them); README's WSFR table is the one
    without, and its text quotes the one with, for the command it names (exp at 65,536)."""
    d, layers, vocab, ctx = 768, 12, 50304, 65536
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "flops.py"), "arch=gpt2", "model=small",
                          "data=longcrawl64", "attention=exp", f"ctx={ctx}"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in out.stdout.splitlines()[:-1])
    state = layers * 4 * d * (ctx + 1) / 2                       # q.K and A.V over the causal mean of keys
    with_head = 2 * (layers * 12 * d * d + d * vocab) / state    # 12 d^2 per layer plus the LM head, 2 per MAC
    without_head = 2 * layers * 12 * d * d / state
    assert rows["WSFR with the LM head (weight:state)"] == f"1:{1 / with_head:.3g}" == "1:4.89"
    assert rows["WSFR without the LM head (README's table)"] == f"1:{1 / without_head:.3g}" == "1:7.11"
    readme = (REPO / "README.md").read_text()
    table = readme.split("### WSFR of GPT-2 small", 1)[1]
    exp_row = next(line for line in table.splitlines() if line.startswith("| exp |"))
    assert exp_row.split("|")[4].strip() == rows["WSFR without the LM head (README's table)"]  # the 65,536 column
    assert "1:4.89" in table.split("| attention |", 1)[0]


@pytest.mark.parametrize("override,message", [
    ("p=7", "config: p=7: power attention supports integer degrees 1..4"),
    ("ctx=0", "config: ctx=0: must be a positive integer"),
    ("+foo=1", "config: foo=1: unknown key (no config file defines it)"),
    ("attention=powr", "config: attention=powr: no such attention option; did you mean power? (options: exp, linear, "
                       "power, window)"),
])
def test_flops_script_bad_override_is_one_line(override, message):
    extra = ["attention=power"] if override.startswith("p=") else []
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "flops.py"), *extra, override],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [f"error: {message}"]


def test_rows_cut_by_reshape_block_count_the_flops_of_their_length(compose, tiny, tmp_path):
    """data.reshape_block=16 trains on rows of 16 tokens: its FLOPs per token, state FLOPs and WSFR are those of a run
    at ctx 16, not of its documents' ctx (the paper's "no long context" ablation, and a flops_budget's stopping step)."""
    from longctx.train.trainer import Trainer

    def flops(*extra):
        folder = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        trainer = Trainer(compose(*tiny, "attention=exp", *extra, f"run_dir={folder}"))   # exp: FLOPs grow with ctx
        return {k: trainer.flops[k] for k in ("train_flops_per_token", "state_flops_per_token", "wsfr")}
    cut, short, whole = flops("ctx=64", "data.reshape_block=16"), flops("ctx=16"), flops("ctx=64")
    assert cut == short and cut["state_flops_per_token"] != whole["state_flops_per_token"]
