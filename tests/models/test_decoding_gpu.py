"""GPU checks of the static decoder (on the device: `pytest -m gpu tests/models/test_decoding_gpu.py`; the quick
set, without the benchmark: `-m "gpu and not slow"`): for every arch x attention pair, bf16 autocast, the
default fast path's logits (the step compiled, power's state by the fused kernel, one CUDA graph per token) and the
uncompiled graph step's against the eager cached path's over 256 teacher-forced tokens; the fused kernel against the
float64 step, as close as the plain fp32 step over 300 tokens and within bf16 rounding from a random state (p = 1..4,
gated and not, GQA, batch 1 and 8), and inside a CUDA graph; graph
replays allocate nothing and power's state stays the same size; the benchmark's rows run on the graph path."""
import pytest
import torch

from _checks import perturb_
from longctx.kernels import power_decode_step, power_state_step, symmetric_power_indices
from longctx.kernels.power.decode import gate_log
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


@pytest.mark.parametrize("path", [{}, dict(compile=False), dict(fused=False)], ids=["default", "graph", "plain"])
@pytest.mark.parametrize("attention, params", CASES)
@pytest.mark.parametrize("arch", ARCHS)
def test_graph_step_matches_eager_cached_path_bf16(arch, attention, params, path):
    """A 64-token prompt, then 256 tokens fed one at a time (the same tokens both ways; the window's ring wraps):
    the static decoder's logits (one CUDA graph per step; `default`: the step compiled first and power's state by
    its fused kernel, what `generate` runs; `graph`: not compiled; `plain`: compiled, power's state by plain torch
    ops) against the eager cached path's, bf16 autocast, every step
    within bf16 tolerance; the step really runs as a graph, compiled where asked."""
    if path.get("compile", True):  # a fresh compile for every case: past torch's recompile limit a step would run eager
        torch._dynamo.reset()
    model = gpu_model(arch, attention, params)
    x = torch.randint(0, VOCAB, (2, 321), device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        cache = model.new_cache()
        ref = [model(x[:, :64], cache=cache, last_only=True)[:, -1]]
        ref += [model(x[:, i:i + 1], cache=cache)[:, -1] for i in range(64, 320)]
        decoder = StaticDecoder(model, capacity=321, **path)
        got = [decoder.prefill(x[:, :64])] + [decoder.step(x[:, i:i + 1]).clone() for i in range(64, 320)]
    assert decoder.mode == "cuda-graph" and decoder.graph_error is None, decoder.graph_error
    assert decoder.compile == path.get("compile", True) and decoder.compile_error is None, decoder.compile_error
    # linear attention is power of degree 1 on GPT-2 and Llama; RWKV-7's linear is its own delta rule
    power_state = attention == "power" or (attention == "linear" and arch != "rwkv7")
    assert ("fused power kernel" in decoder.describe()) == (power_state and path.get("fused", True)), decoder.describe()
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
    """A short benchmark on the GPU: every static row is captured as a graph, no row fails; the state step alone is
    timed fused and plain."""
    result = import_script("bench_decode").main(["--out", str(tmp_path), "--prefixes", "1024,4096", "--batches", "8",
                                                  "--new-tokens", "16", "--models", "power,exp", "--no-compile"])
    for name, rows in result["models"].items():
        assert not any("error" in r for r in rows), (name, rows)
        assert all(r["mode"] == "cuda-graph" for r in rows if r["path"] == "static"), (name, rows)
    power = [r for r in result["models"]["power"] if r["path"] == "static" and r["batch"] == 1]
    assert len({r["state_bytes"] for r in power}) == 1
    assert [r["batch"] for r in result["state_step"]] == [1, 8]
    assert all(r["fused_us_per_layer"] > 0 and r["plain_us_per_layer"] > 0 for r in result["state_step"])


@pytest.mark.slow  # compiles for seconds: `-m gpu` runs it, `-m "gpu and not slow"` leaves it out
@pytest.mark.parametrize("scope", ["blocks", "model"])
@pytest.mark.parametrize("attention", ["power", "exp"])
def test_compiled_step_matches_eager_cached_path_bf16(attention, scope):
    """StaticDecoder(compile=True): every layer's step compiled (or the whole one-token forward: scope "model"),
    then captured in the graph; the same check as above over 64 steps, and no compile error."""
    model = gpu_model("gpt2", attention, {})
    x = torch.randint(0, VOCAB, (2, 129), device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        cache = model.new_cache()
        ref = [model(x[:, :64], cache=cache, last_only=True)[:, -1]]
        ref += [model(x[:, i:i + 1], cache=cache)[:, -1] for i in range(64, 128)]
        decoder = StaticDecoder(model, capacity=129, compile=True, compile_scope=scope)
        got = [decoder.prefill(x[:, :64])] + [decoder.step(x[:, i:i + 1]).clone() for i in range(64, 128)]
    assert decoder.mode == "cuda-graph" and decoder.graph_error is None and decoder.compile_error is None
    assert max(rel(g.float(), r.float()) for g, r in zip(got, ref)) < 3e-2


def rel_max(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("b", [1, 8])
@pytest.mark.parametrize("gated", ["log", "x", None], ids=["log_g", "gate_input", "ungated"])
@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_fused_step_matches_plain_torch_step(p, gated, b):
    """d=64, bf16 q/k/v (GQA: 4 query heads on 2 key heads), fp32 state: 300 tokens (p=4: 20, its state is 250 MB a
    head) from an empty state through the fused kernel, through the plain-torch step in fp32 and through the same
    step in float64 (the truth). Every token's output is as close to the truth as the plain fp32 step's, up to bf16
    rounding: an early token's normalizer, (q.k)^p summed over features of both signs, loses digits in fp32 at p=4
    whatever the order of the sum. The states within fp32 rounding of the truth after all tokens. The gate given as
    its log, or as its input (d_model 768) and parameters, computed in the kernel."""
    g = torch.Generator(device="cuda").manual_seed(p)
    hq, hk, d, tokens = 4, 2, 64, 300 if p < 4 else 20
    norm = p % 2 == 0
    index, weight = symmetric_power_indices(p, d, "cuda")
    D = index.shape[1]
    s = torch.zeros(b, hk, D, d, device="cuda")
    z = torch.zeros(b, hk, D, device="cuda")
    s_ref, z_ref, s64, z64 = s.clone(), z.clone(), s.double(), z.double()
    ticket = torch.zeros(b * hk, dtype=torch.int32, device="cuda")
    gate_w = 0.02 * torch.randn(hk, 768, device="cuda", generator=g)
    gate_b = torch.full((hk,), 3.0, device="cuda")
    worst = worst_ref = 0.0
    for _ in range(tokens):
        q, k, v = (torch.randn(b, 1, h, d, device="cuda", generator=g).bfloat16() for h in (hq, hk, hk))
        log_g = -0.05 * torch.rand(b, 1, hk, device="cuda", generator=g) if gated == "log" else None
        gate = None
        if gated == "x":
            gate = (torch.randn(b, 1, 768, device="cuda", generator=g), gate_w, gate_b)
        y = power_decode_step(s, z, index.int(), weight, ticket, q, k, v, log_g, p, norm, d ** -0.5, gate=gate)
        lg = gate_log(*gate) if gate else log_g
        y_ref = power_state_step(s_ref, z_ref, index, weight, q, k, v, lg, p, norm, d ** -0.5)
        y64 = power_state_step(s64, z64, index, weight.double(), q.double(), k.double(), v.double(), lg, p, norm,
                               d ** -0.5)
        assert y.dtype == torch.bfloat16 and torch.isfinite(y).all()
        worst, worst_ref = max(worst, rel_max(y, y64)), max(worst_ref, rel_max(y_ref, y64))
    assert ticket.eq(0).all()
    assert worst < 2 * worst_ref + 1e-2, (worst, worst_ref)
    assert max(rel_max(s, s64), rel_max(z, z64), rel_max(s_ref, s64)) < 1e-4


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_fused_step_equals_float64_step_from_a_random_state(p):
    """d=64 from a random state with a positive normalizer (S ~ 0.01 N(0, 1), z ~ U(0, 1)): 3 tokens through the
    fused kernel are the float64 step's within bf16 rounding, for 1, 2 and 4 query heads a key head, gated or not,
    batch 1 and 8 (a joint 3-D product of the query heads gave wrong outputs here at p=4, 2 query heads a key head)."""
    d, hk = 64, 2
    index, weight = symmetric_power_indices(p, d, "cuda")
    for rep, gated, b in [(1, False, 1), (2, False, 1), (4, False, 1), (1, True, 1), (2, True, 1), (4, True, 1),
                          (2, True, 8)]:
        g = torch.Generator(device="cuda").manual_seed(10 * p + rep)
        s = 0.01 * torch.randn(b, hk, index.shape[1], d, device="cuda", generator=g)
        z = torch.rand(b, hk, index.shape[1], device="cuda", generator=g)
        s64, z64 = s.double(), z.double()
        ticket = torch.zeros(b * hk, dtype=torch.int32, device="cuda")
        for _ in range(3):
            q, k, v = (torch.randn(b, 1, h, d, device="cuda", generator=g).bfloat16() for h in (rep * hk, hk, hk))
            log_g = -0.05 * torch.rand(b, 1, hk, device="cuda", generator=g) if gated else None
            y = power_decode_step(s, z, index.int(), weight, ticket, q, k, v, log_g, p, p % 2 == 0, d ** -0.5)
            y64 = power_state_step(s64, z64, index, weight.double(), q.double(), k.double(), v.double(), log_g, p,
                                   p % 2 == 0, d ** -0.5)
            assert rel_max(y, y64) < 1e-2, (rep, gated, b, rel_max(y, y64))
        assert ticket.eq(0).all() and rel_max(s, s64) < 1e-6


def test_fused_step_in_a_cuda_graph_replays_what_it_computes_eagerly():
    """The fused kernel captured in a CUDA graph: every replay gives, bit for bit, what the same launch gives
    eagerly from the same state (its shares are added in a fixed order), and the ticket is back at zero."""
    g = torch.Generator(device="cuda").manual_seed(0)
    index, weight = symmetric_power_indices(2, 64, "cuda")
    D = index.shape[1]
    s, z = torch.randn(1, 12, D, 64, device="cuda", generator=g), torch.rand(1, 12, D, device="cuda", generator=g)
    q, k, v = (torch.randn(1, 1, 12, 64, device="cuda", generator=g).bfloat16() for _ in range(3))
    log_g = -torch.rand(1, 1, 12, device="cuda", generator=g)
    ticket = torch.zeros(12, dtype=torch.int32, device="cuda")
    args = (index.int(), weight, ticket, q, k, v, log_g, 2, True, 0.125)
    s_eager, z_eager = s.clone(), z.clone()
    power_decode_step(s_eager.clone(), z_eager.clone(), *args)             # compiled and launched once, outside
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        power_decode_step(s.clone(), z.clone(), *args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_graph = power_decode_step(s, z, *args)
    for _ in range(3):
        s_before, z_before = s.clone(), z.clone()
        graph.replay()
        y_eager = power_decode_step(s_before, z_before, *args)
        torch.cuda.synchronize()
        assert torch.equal(y_graph, y_eager) and torch.equal(s, s_before) and torch.equal(z, z_before)
    assert ticket.eq(0).all()
