"""GPU checks of the static decoder (on the device: `pytest -m gpu tests/models/test_decoding_gpu.py`; the quick
set, without the compiled step and the benchmark: `-m "gpu and not slow"`): for every
arch x attention pair, bf16 autocast, the CUDA-graph step's logits against the eager cached path's over 256
teacher-forced tokens; graph replays allocate nothing and power's state stays the same size; the benchmark's rows
run on the graph path."""
import pytest
import torch

from _checks import perturb_
from longctx.models import ATTENTIONS, ModelSpec, build_model
from longctx.models.decoding import StaticDecoder
from longctx.models.spec import ARCHS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

VOCAB = 97
CASES = [pytest.param(name, {}, id=name) for name in sorted(ATTENTIONS)]  # variants (sink, p=3, ...): CPU tests


def test_cases_cover_every_attention():
    assert {c.values[0] for c in CASES} == set(ATTENTIONS)


def gpu_model(arch, attention, params):
    """head_dim 64 (GPT-2 small's), a window of 64 shorter than the prompt."""
    params = dict(params, window=64) if attention == "window" else params
    spec = ModelSpec(arch=arch, attention=attention, attention_params=params, vocab_size=VOCAB, d_model=256,
                     n_layers=2, n_heads=4, ctx=512)
    torch.manual_seed(0)
    return perturb_(build_model(spec), 0.02).cuda().eval()


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("attention, params", CASES)
@pytest.mark.parametrize("arch", ARCHS)
def test_graph_step_matches_eager_cached_path_bf16(arch, attention, params):
    """A 64-token prompt, then 256 tokens fed one at a time (the same tokens both ways; the window's ring wraps):
    the static decoder's logits (one CUDA graph per step) against the eager cached path's, bf16 autocast, every
    step within bf16 tolerance; the step really runs as a graph."""
    model = gpu_model(arch, attention, params)
    x = torch.randint(0, VOCAB, (2, 321), device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        cache = model.new_cache()
        ref = [model(x[:, :64], cache=cache, last_only=True)[:, -1]]
        ref += [model(x[:, i:i + 1], cache=cache)[:, -1] for i in range(64, 320)]
        decoder = StaticDecoder(model, capacity=321)
        got = [decoder.prefill(x[:, :64])] + [decoder.step(x[:, i:i + 1]).clone() for i in range(64, 320)]
    assert decoder.mode == "cuda-graph" and decoder.graph_error is None, decoder.graph_error
    errors = [rel(g.float(), r.float()) for g, r in zip(got, ref)]
    assert max(errors) < 3e-2, max(errors)
    assert rel(torch.stack(got).float(), torch.stack(ref).float()) < 1.5e-2


@pytest.mark.parametrize("arch, attention", [("gpt2", "power"), ("gpt2", "exp"), ("rwkv7", "linear")])
def test_graph_greedy_generation_equals_recomputation_fp32(arch, attention):
    """fp32 (no TF32): greedy tokens of the default path (static decoder, CUDA graphs) equal recomputing the prefix."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        model = gpu_model(arch, attention, {})
        prompt = torch.randint(0, VOCAB, (2, 20), device="cuda")
        fast = model.generate(prompt, 24, temperature=0)
        assert torch.equal(fast, model.generate(prompt, 24, temperature=0, use_cache=False))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def test_graph_replays_allocate_nothing_and_power_state_is_constant():
    model = gpu_model("gpt2", "power", {})
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        decoder = StaticDecoder(model, capacity=1200)
        logits = decoder.prefill(torch.randint(0, VOCAB, (1, 900), device="cuda"))
        for _ in range(10):
            logits = decoder.step(logits.argmax(-1, keepdim=True))
        torch.cuda.synchronize()
        allocated, state = torch.cuda.memory_allocated(), decoder.state_bytes()
        for _ in range(250):
            logits = decoder.step(logits.argmax(-1, keepdim=True))
        torch.cuda.synchronize()
    assert decoder.mode == "cuda-graph"
    # the argmax outputs are freed each step: the allocator ends where it was
    assert torch.cuda.memory_allocated() == allocated and decoder.state_bytes() == state
    assert state == 2 * 4 * model.blocks[0].attn.core.expanded_dim * (64 + 1) * 4   # layers x heads x (D x d + D) fp32


@pytest.mark.slow  # about a minute: `-m gpu` runs it, `-m "gpu and not slow"` leaves it out
def test_bench_decode_rows_run_on_graphs(import_script, tmp_path):
    """A short benchmark on the GPU: every static row is captured as a graph, no row fails."""
    result = import_script("bench_decode").main(["--out", str(tmp_path), "--prefixes", "1024,4096", "--batches", "8",
                                                  "--new-tokens", "16", "--models", "power,exp", "--no-compile"])
    for name, rows in result["models"].items():
        assert not any("error" in r for r in rows), (name, rows)
        assert all(r["mode"] == "cuda-graph" for r in rows if r["path"] == "static"), (name, rows)
    power = [r for r in result["models"]["power"] if r["path"] == "static" and r["batch"] == 1]
    assert len({r["state_bytes"] for r in power}) == 1


@pytest.mark.slow  # compiles for seconds: `-m gpu` runs it, `-m "gpu and not slow"` leaves it out
@pytest.mark.parametrize("attention", ["power", "exp"])
def test_compiled_step_matches_eager_cached_path_bf16(attention):
    """StaticDecoder(compile=True): every layer's step compiled, then captured in the graph; the same check as
    above over 64 steps, and no compile error."""
    model = gpu_model("gpt2", attention, {})
    x = torch.randint(0, VOCAB, (2, 129), device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        cache = model.new_cache()
        ref = [model(x[:, :64], cache=cache, last_only=True)[:, -1]]
        ref += [model(x[:, i:i + 1], cache=cache)[:, -1] for i in range(64, 128)]
        decoder = StaticDecoder(model, capacity=129, compile=True)
        got = [decoder.prefill(x[:, :64])] + [decoder.step(x[:, i:i + 1]).clone() for i in range(64, 128)]
    assert decoder.mode == "cuda-graph" and decoder.graph_error is None and decoder.compile_error is None
    assert max(rel(g.float(), r.float()) for g, r in zip(got, ref)) < 3e-2
