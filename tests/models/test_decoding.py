"""Decoding with per-layer caches and with the static decoder against recomputing the whole prefix, for every
arch x attention pair (CPU, fp32): the logits of a prompt and of every generated token agree within 1e-4, greedy
generation agrees token for token; the static step updates its buffers in place and never reads a value back to the
host (what a CUDA graph needs); the one-token state updates against float64 references; the caches are the sizes
they should be; sampling options and bad arguments."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from longctx.kernels.power.reference import PowerState, expand, power_attention_reference
from longctx.models import ATTENTIONS, build_model
from longctx.kernels import symmetric_power_indices
from longctx.models.attention.power import StaticPowerState
from longctx.models.attention.shared import KVCache, StaticKVCache
from longctx.models.decoding import (RowLinear, StaticDecoder, autocast_weights, compile_available, sample_next,
                                     takes_fused_state)
from longctx.models.rwkv7 import StaticRWKV7State, rwkv7_recurrent
from _checks import VOCAB, arch_params, assert_cached_equals_full, perturb_, tiny_spec

CASES = [pytest.param(dict(attention="exp"), id="exp"),
         pytest.param(dict(attention="exp", sink=True), id="exp-sink"),
         pytest.param(dict(attention="exp", rope_dims=8), id="exp-rope8of16"),
         pytest.param(dict(attention="window", window=5), id="window5"),
         pytest.param(dict(attention="linear"), id="linear"),
         pytest.param(dict(attention="power", p=2, gating=False), id="power2-ungated"),
         pytest.param(dict(attention="power", p=2, output_norm=True), id="power2-output_norm")]
CASES += [pytest.param(dict(attention="power", p=p), id=f"power{p}-chunked") for p in (1, 2)]
CASES += [pytest.param(dict(attention="power", p=p, chunk_size=None), id=f"power{p}") for p in (3, 4)]  # big states: quadratic form


def test_cases_cover_every_attention():
    assert {c.values[0]["attention"] for c in CASES} == set(ATTENTIONS)


def model_for(arch, case, seed=0, scale=0.05):
    torch.manual_seed(seed)
    return perturb_(build_model(tiny_spec(arch, **case)), scale, seed=seed).eval()


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("arch", arch_params())
def test_cached_logits_equal_full_forward(arch, case):
    """A 9-token prompt (longer than the window of 5), then one token at a time: every position's logits equal
    those of one forward over the whole sequence (rotary positions, gates, states, token shifts all continue)."""
    model = model_for(arch, case)
    x = torch.randint(0, VOCAB, (2, 21))
    full, cache = assert_cached_equals_full(model, x, prompt=9, atol=1e-4)
    assert all(c.pos == 21 for c in cache)
    with torch.no_grad():  # the prompt's last position alone (what generate keeps of a long prompt)
        last = model(x[:, :9], cache=model.new_cache(), last_only=True)
    assert last.shape == (2, 1, full.shape[-1])
    torch.testing.assert_close(last, full[:, 8:9], rtol=0, atol=1e-4)


@pytest.mark.parametrize("path", [{}, dict(static=True, compile=False), dict(static=False)],
                         ids=["default", "static", "cached"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("arch", arch_params())
def test_greedy_generation_cached_equals_recomputed(arch, case, path):
    """The default path (`generate` with no options: the static decoder, here on CPU uncompiled), the static
    decoder and the eager cached path all generate the tokens recomputation does."""
    model = model_for(arch, case, seed=1, scale=0.2)  # weights far enough from init for varied continuations
    prompt = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(8))
    cached = model.generate(prompt, 14, temperature=0, **path)
    naive = model.generate(prompt, 14, temperature=0, use_cache=False)
    assert cached.shape == (2, 20) and torch.equal(cached[:, :6], prompt)
    assert torch.equal(cached, naive)
    assert len(set(cached[:, 6:].flatten().tolist())) > 3  # not a degenerate constant continuation


class HostReads(TorchDispatchMode):
    """Records every op that reads a tensor's value back to the host or builds a tensor from host data: inside a
    CUDA graph capture each of them fails (a sync) or is frozen into the graph (a constant)."""
    HOST = {"_local_scalar_dense", "nonzero", "is_nonzero", "equal", "lift_fresh", "item"}

    def __init__(self):
        super().__init__()
        self.found = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in self.HOST:
            self.found.append(str(func))
        return func(*args, **(kwargs or {}))


def buffers(cache):
    """data_ptr of every tensor a static cache holds: states, token-shift inputs, positions."""
    out = []
    for layer in cache:
        out += [layer.pos.data_ptr()] + [t.data_ptr() for t in layer.shift.values()]
        out += [v.data_ptr() for v in vars(layer.state).values() if isinstance(v, torch.Tensor)]
    return out


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("arch", arch_params())
def test_static_decoder_equals_full_forward_in_place(arch, case):
    """The static decoder: a 9-token prompt, then one token a step into buffers of 21 positions (the window of 5
    wraps its ring): every step's logits equal one forward over the whole sequence; every step writes the same
    buffers (their addresses never change) and reads nothing back to the host."""
    model = model_for(arch, case)
    x = torch.randint(0, VOCAB, (2, 21))
    with torch.no_grad():
        full = model(x)
        decoder = StaticDecoder(model, capacity=21)
        parts = [decoder.prefill(x[:, :9])]
        before, states = buffers(decoder.cache), [layer.state for layer in decoder.cache]
        for i in range(9, 21):
            with HostReads() as reads:
                parts.append(decoder.step(x[:, i:i + 1]).clone())
            assert reads.found == [], reads.found
    torch.testing.assert_close(torch.stack(parts, 1), full[:, 8:], rtol=0, atol=1e-4)
    assert buffers(decoder.cache) == before and [layer.state for layer in decoder.cache] == states
    assert all(int(layer.pos) == 21 for layer in decoder.cache) and decoder.mode == "eager"


def test_static_decoder_refuses_a_prompt_without_room():
    model = model_for("gpt2", dict(attention="exp"))
    with pytest.raises(ValueError, match="capacity=4 leaves no room after a prompt of 4 tokens"):
        StaticDecoder(model, capacity=4).prefill(torch.zeros(1, 4, dtype=torch.long))


@pytest.mark.parametrize("arch, case", [("gpt2", dict(attention="power", p=2)), ("gpt2", dict(attention="exp")),
                                        ("rwkv7", dict(attention="linear"))], ids=["gpt2-power", "gpt2-exp", "rwkv7"])
def test_static_decoder_under_bf16_autocast_matches_cached_path(arch, case):
    """What the GPU runs, on the CPU: bf16 autocast, Linear weights cast once (autocast_weights), the static step
    against the eager cached path, teacher-forced over 24 tokens, within bf16 tolerance."""
    model = model_for(arch, case)
    x = torch.randint(0, VOCAB, (2, 32))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        cache = model.new_cache()
        ref = [model(x[:, :8], cache=cache, last_only=True)[:, -1]]
        ref += [model(x[:, i:i + 1], cache=cache)[:, -1] for i in range(8, 32)]
        decoder = StaticDecoder(model, capacity=32)
        got = [decoder.prefill(x[:, :8])] + [decoder.step(x[:, i:i + 1]).clone() for i in range(8, 32)]
    ref, got = torch.stack(ref).float(), torch.stack(got).float()
    assert ((got - ref).norm() / ref.norm()).item() < 2e-2


def test_autocast_weights_compute_what_autocast_computes():
    """The copy with bf16 Linear weights gives the same logits as the fp32 model under bf16 autocast, bit for bit;
    the embedding stays fp32 (the residual stream's dtype), the model itself is untouched."""
    model = model_for("gpt2", dict(attention="exp"))
    x = torch.randint(0, VOCAB, (2, 12))
    assert autocast_weights(model) is model                                  # autocast off: nothing to cast
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        twin = autocast_weights(model)
        assert torch.equal(twin(x), model(x))
    assert twin.lm_head.weight.dtype == torch.bfloat16 and twin.wte.weight.dtype == torch.float32
    assert model.lm_head.weight.dtype == torch.float32 and model.lm_head.weight is model.wte.weight


# -- one-token state updates against independent references -------------------------------------------------

@pytest.mark.parametrize("p, d", [(1, 16), (2, 16), (2, 32), (3, 8), (4, 8)])
def test_symmetric_power_indices_reproduce_expand(p, d):
    x = torch.randn(3, d, dtype=torch.float64)
    index, weight = symmetric_power_indices(p, d)
    gathered = torch.stack([x[:, i] for i in index]).prod(0)
    torch.testing.assert_close(gathered, expand(x, p), rtol=0, atol=0)
    torch.testing.assert_close(gathered * weight.double(), expand(x, p, weighted=True), rtol=1e-15, atol=0)


@pytest.mark.parametrize("gated", [True, False], ids=["gated", "ungated"])
@pytest.mark.parametrize("p, norm", [(1, False), (2, True), (2, False), (3, False), (4, True)])
def test_static_power_step_matches_float64_reference(p, norm, gated):
    """One token after a 7-token state, GQA (4 query heads on 2 key heads): the in-place step's output and state
    equal the float64 reference's chunked form with that state in and out."""
    g = torch.Generator().manual_seed(p)
    b, hq, hk, d = 2, 4, 2, 8
    q, k, v = (torch.randn(b, 8, h, d, generator=g, dtype=torch.float64) for h in (hq, hk, hk))
    lg = -torch.rand(b, 8, hk, generator=g, dtype=torch.float64) if gated else None
    _, st = power_attention_reference(q[:, :7], k[:, :7], v[:, :7], None if lg is None else lg[:, :7], p=p,
                                      norm=norm, chunk_size=4, return_state=True)
    y_ref, st_ref = power_attention_reference(q[:, 7:], k[:, 7:], v[:, 7:], None if lg is None else lg[:, 7:], p=p,
                                              norm=norm, initial_state=st, return_state=True)
    static = StaticPowerState(PowerState(st.s.clone(), st.z.clone()), p)
    s_ptr = static.s.data_ptr()
    y = static.step(q[:, 7:], k[:, 7:], v[:, 7:], None if lg is None else lg[:, 7:], p=p, norm=norm, scale=d ** -0.5)
    # normalized: the step's epsilon term is EPS * (the whole denominator), the reference's EPS * (its largest part):
    # the same guard, different at the EPS = 1e-6 relative level only
    torch.testing.assert_close(y, y_ref, rtol=2e-6 if norm else 1e-10, atol=1e-12)
    torch.testing.assert_close(static.s, st_ref.s, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(static.z, st_ref.z, rtol=1e-12, atol=1e-12)
    assert static.s.data_ptr() == s_ptr


def test_static_rwkv7_step_matches_the_rule():
    g = torch.Generator().manual_seed(0)
    b, t, h, d = 2, 9, 2, 8
    r, k, v, kk = (torch.randn(b, t, h, d, generator=g, dtype=torch.float64) for _ in range(4))
    w = -0.6 * torch.rand(b, t, h, d, generator=g, dtype=torch.float64)
    kk = torch.nn.functional.normalize(kk, dim=-1)
    a, bb = -kk, kk * torch.rand(b, t, h, d, generator=g, dtype=torch.float64)
    S, ref = torch.zeros(b, h, d, d, dtype=torch.float64), []      # the rule written out, float64 (rwkv7.py's docstring)
    for i in range(t):
        S = (S * w[:, i, :, :, None].exp() + bb[:, i, :, :, None] * torch.einsum("bhk,bhkv->bhv", a[:, i], S)[:, :, None]
             + k[:, i, :, :, None] * v[:, i, :, None, :])
        ref.append(torch.einsum("bhk,bhkv->bhv", r[:, i], S))
    ref = torch.stack(ref, dim=1)
    torch.testing.assert_close(rwkv7_recurrent(r, w, k, v, a, bb).double(), ref, rtol=1e-4, atol=1e-5)  # fp32 inside
    state = StaticRWKV7State(torch.zeros(b, h, d, d, dtype=torch.float64))
    got = torch.cat([state.step(*(z[:, i:i + 1] for z in (r, w, k, v, a, bb))) for i in range(t)], dim=1)
    torch.testing.assert_close(got.double(), ref.double(), rtol=1e-10, atol=1e-12)


def test_static_kv_ring_keeps_the_newest_window():
    """A ring of 4 slots after a 6-token prompt, then 9 tokens: the filled slots always hold the newest 4
    positions, each key where its position says."""
    seq = torch.arange(15.0).view(1, 15, 1, 1).expand(1, 15, 1, 2)
    pos = torch.tensor(6)
    ring = StaticKVCache(seq[:, :6], seq[:, :6], pos, capacity=15, window=4)
    for t in range(6, 15):
        ring.append(seq[:, t:t + 1], seq[:, t:t + 1])
        pos += 1
        assert sorted(ring.slot_pos.tolist()) == list(range(t - 3, t + 1))
        assert all(ring.k[0, 0, slot, 0].item() == position for slot, position in enumerate(ring.slot_pos.tolist()))


def test_power_state_does_not_grow_and_kv_cache_does():
    power, exp = model_for("gpt2", dict(attention="power", p=2)), model_for("gpt2", dict(attention="exp"))
    sizes = {}
    for name, model in (("power", power), ("exp", exp)):
        cache = model.new_cache()
        with torch.no_grad():
            model(torch.randint(0, VOCAB, (1, 10)), cache=cache)
            first = cache[0].state
            first = first.s.numel() + first.z.numel() if name == "power" else first.length
            for _ in range(30):
                model(torch.randint(0, VOCAB, (1, 1)), cache=cache)
        last = cache[0].state
        sizes[name] = (first, last.s.numel() + last.z.numel() if name == "power" else last.length)
    assert sizes["power"][0] == sizes["power"][1] == power.blocks[0].attn.core.state_size(1) // 1
    assert sizes["exp"] == (10, 40)


def test_rolling_window_cache_stays_bounded():
    cache = KVCache(keep=4)
    seq = torch.arange(50.0).view(1, 50, 1, 1)
    keys, _ = cache.append(seq[:, :7], seq[:, :7])
    assert keys[0, :, 0, 0].tolist() == list(range(7))
    for t in range(7, 50):
        keys, values = cache.append(seq[:, t:t + 1], seq[:, t:t + 1])
        assert keys[0, -4:, 0, 0].tolist() == list(range(t - 3, t + 1))  # the newest four, in order, end at t
        assert cache.nbytes() <= 2 * 11 * 4  # capacity at most max(2 * keep, keep + the prompt's 7)


def test_kv_cache_returned_views_survive_later_appends():
    cache = KVCache()
    keys, _ = cache.append(torch.ones(1, 3, 1, 2), torch.ones(1, 3, 1, 2))
    for _ in range(40):  # several reallocations
        cache.append(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))
    assert keys.eq(1).all() and cache.length == 43


def test_sampling_options():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.9]])
    assert sample_next(logits, 0, None).item() == 1
    assert sample_next(logits, 1.0, top_k=1).item() == 1
    draws = {sample_next(logits, 1.0, 2, torch.Generator().manual_seed(s)).item() for s in range(40)}
    assert draws == {1, 3}  # top_k=2 keeps the two largest logits only
    model = model_for("gpt2", dict(attention="power"))
    prompt = torch.randint(0, VOCAB, (1, 4))
    a = model.generate(prompt, 8, temperature=0.8, top_k=5, generator=torch.Generator().manual_seed(3))
    b = model.generate(prompt, 8, temperature=0.8, top_k=5, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


@pytest.mark.parametrize("kwargs, words", [
    (dict(idx=torch.tensor([[1, VOCAB]])), f"token id {VOCAB} is outside the model's vocabulary 0..{VOCAB - 1}"),
    (dict(idx=torch.tensor([[1, -1]])), "token id -1"),
    (dict(idx=torch.tensor([1, 2])), "idx must be a (batch, seq) integer tensor"),
    (dict(max_new_tokens=-1), "max_new_tokens"),
    (dict(temperature=-0.5), "temperature"),
    (dict(temperature=float("nan")), "temperature must be a finite number"),
    (dict(top_k=0), "top_k"),
])
def test_bad_generate_arguments_name_themselves(kwargs, words):
    model = model_for("gpt2", dict(attention="exp"))
    args = dict(idx=torch.tensor([[1, 2]]), max_new_tokens=3) | kwargs
    with pytest.raises(ValueError) as err:
        model.generate(**args)
    assert words in str(err.value)


def test_failed_graph_capture_is_reported_and_decoding_goes_on():
    """A capture that fails (here: no CUDA at all) leaves a warning and `graph_error`, tried once; the same static
    step then runs eagerly and computes the same logits."""
    model = model_for("gpt2", dict(attention="power", p=2))
    x = torch.randint(0, VOCAB, (1, 12))
    with torch.no_grad():
        full = model(x)
        decoder = StaticDecoder(model, capacity=12, warmup=1)
        decoder.use_graphs = True
        parts = [decoder.prefill(x[:, :6]), decoder.step(x[:, 6:7]).clone()]       # the warm-up step
        with pytest.warns(RuntimeWarning, match="CUDA graph capture of the decoding step failed"):
            parts.append(decoder.step(x[:, 7:8]).clone())
        parts += [decoder.step(x[:, i:i + 1]).clone() for i in range(8, 12)]        # no second attempt, no warning
    assert decoder.mode == "eager" and decoder.graph_error
    torch.testing.assert_close(torch.stack(parts, 1), full[:, 5:], rtol=0, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("arch, case", [("gpt2", dict(attention="power", p=2)), ("gpt2", dict(attention="exp")),
                                        ("rwkv7", dict(attention="linear"))], ids=["gpt2-power", "gpt2-exp", "rwkv7"])
def test_compiled_static_step_equals_full_forward(arch, case):
    """StaticDecoder(compile=True, compile_scope="blocks") (CPU inductor here; on CUDA the compiled step is then
    captured): every layer's one-token step compiled, the logits of every step equal a full forward, the caller's model stays uncompiled."""
    model = model_for(arch, case)
    x = torch.randint(0, VOCAB, (2, 16))
    with torch.no_grad():
        full = model(x)
        decoder = StaticDecoder(model, capacity=16, compile=True, compile_scope="blocks")
        parts = [decoder.prefill(x[:, :9])] + [decoder.step(x[:, i:i + 1]).clone() for i in range(9, 16)]
    assert decoder.compile_error is None and decoder.model is not model
    assert all(b._compiled_call_impl is not None for b in decoder.model.residual_blocks)
    assert all(getattr(b, "_compiled_call_impl", None) is None for b in model.residual_blocks)
    torch.testing.assert_close(torch.stack(parts, 1), full[:, 8:], rtol=0, atol=1e-4)


def test_failed_compilation_restores_the_buffers_and_decodes_uncompiled(monkeypatch):
    """A compiled step that fails after writing into the buffers (a stand-in compiler that breaks halfway): the
    buffers are restored, a warning and `compile_error` say why, and every step's logits are still right."""
    model = model_for("gpt2", dict(attention="power", p=2))
    x = torch.randint(0, VOCAB, (1, 12))

    def broken_compile(decoder, on):
        for block in decoder.model.residual_blocks:
            if on:
                def fail(*args, block=block, **kwargs):
                    block._call_impl(*args, **kwargs)       # the plain forward runs, writing the buffers...
                    raise RuntimeError("compiler broke")  # ...then the "compiled" call fails
                block._compiled_call_impl = fail
            else:
                block._compiled_call_impl = None
    monkeypatch.setattr(StaticDecoder, "_set_compiled", broken_compile)
    with torch.no_grad():
        full = model(x)
        decoder = StaticDecoder(model, capacity=12, compile=True)
        parts = [decoder.prefill(x[:, :6])]
        with pytest.warns(RuntimeWarning, match="compiling the decoding step failed"):
            parts.append(decoder.step(x[:, 6:7]).clone())
        parts += [decoder.step(x[:, i:i + 1]).clone() for i in range(7, 12)]
    assert decoder.compile_error == "RuntimeError: compiler broke" and not decoder.compile
    torch.testing.assert_close(torch.stack(parts, 1), full[:, 5:], rtol=0, atol=1e-4)


def test_fast_path_defaults_and_their_fallback(monkeypatch):
    """Compiled by default only where it can be (CUDA with TorchDynamo and Triton): not on CPU, not where Dynamo is
    unsupported; the static decoder says which path it took; power states take the fused kernel by default (on CPU
    it dispatches to plain torch ops), and fused=False (the plain-torch power step) decodes the same tokens."""
    assert not compile_available(torch.device("cpu"))
    monkeypatch.setattr(torch._dynamo, "is_dynamo_supported", lambda: False)
    assert not compile_available(torch.device("cuda"))
    monkeypatch.undo()
    model = model_for("gpt2", dict(attention="power", p=2), seed=1, scale=0.2)
    x = torch.randint(0, VOCAB, (1, 10))
    with torch.no_grad():
        decoders = [StaticDecoder(model, capacity=10), StaticDecoder(model, capacity=10, fused=False)]
        outs = []
        for decoder in decoders:
            logits = [decoder.prefill(x[:, :5])] + [decoder.step(x[:, i:i + 1]).clone() for i in range(5, 9)]
            outs.append(torch.stack(logits, 1))
    assert not decoders[0].compile and decoders[0].describe() == "static buffers"
    assert [layer.state.fused for layer in decoders[0].cache] == [True] * len(decoders[0].cache)
    assert [layer.state.fused for layer in decoders[1].cache] == [False] * len(decoders[1].cache)
    assert takes_fused_state(model) and takes_fused_state(model_for("gpt2", dict(attention="linear")))
    assert not takes_fused_state(model_for("gpt2", dict(attention="exp")))
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("arch, case", [("gpt2", dict(attention="power", p=2)),
                                        pytest.param("gpt2", dict(attention="exp"), marks=pytest.mark.slow),
                                        pytest.param("rwkv7", dict(attention="linear"), marks=pytest.mark.slow)],
                         ids=["gpt2-power", "gpt2-exp", "rwkv7"])
def test_whole_model_compiled_step_equals_full_forward(arch, case):
    """compile_scope="model": the whole one-token forward (embedding, every block, LM head) compiled as one graph
    (CPU inductor here), the logits of every step equal a full forward, and the blocks stay uncompiled; with
    greedy=True the compiled steps choose the tokens recomputation does."""
    model = model_for(arch, case)
    x = torch.randint(0, VOCAB, (2, 16))
    with torch.no_grad():
        full = model(x)
        decoder = StaticDecoder(model, capacity=16, compile=True, compile_scope="model")
        parts = [decoder.prefill(x[:, :9])] + [decoder.step(x[:, i:i + 1]).clone() for i in range(9, 16)]
    assert decoder.compile_error is None and decoder.compiled_forward is not None
    assert "compiled model step" in decoder.describe()
    assert all(getattr(b, "_compiled_call_impl", None) is None for b in decoder.model.residual_blocks)
    torch.testing.assert_close(torch.stack(parts, 1), full[:, 8:], rtol=0, atol=1e-4)
    with torch.no_grad():  # greedy: the argmax and its bookkeeping compiled into the same graph
        greedy = StaticDecoder(model, capacity=16, compile=True, greedy=True)
        first = greedy.prefill(x[:, :9]).argmax(-1, keepdim=True)
        tokens = torch.cat([x[:, :9], first, greedy.greedy(6, first=first)], dim=1)
    assert greedy.compile_error is None
    assert torch.equal(tokens, model.generate(x[:, :9], 7, temperature=0, use_cache=False))
    with pytest.raises(ValueError, match="compile_scope='layers': expected 'blocks' or 'model'"):
        StaticDecoder(model, capacity=16, compile_scope="layers")


@pytest.mark.parametrize("arch, case", [("gpt2", dict(attention="power", p=2)), ("gpt2", dict(attention="window",
                                        window=5)), ("rwkv7", dict(attention="linear"))], ids=["power", "window", "rwkv7"])
def test_greedy_steps_choose_the_argmax_of_their_own_logits(arch, case):
    """StaticDecoder(greedy=True): each step's token is the argmax of that step's logits (checked against a second
    decoder fed those tokens by hand), they are recorded in order, and a later greedy() call continues the same
    sequence; greedy() and step(None) without greedy=True, and a step past the capacity, are refused by name."""
    model = model_for(arch, case, seed=1, scale=0.2)
    prompt = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        decoder = StaticDecoder(model, capacity=16, greedy=True)
        first = decoder.prefill(prompt).argmax(-1, keepdim=True)
        tokens = torch.cat([decoder.greedy(4, first=first), decoder.greedy(5)], dim=1)
        by_hand = StaticDecoder(model, capacity=16)
        logits, fed = by_hand.prefill(prompt), first
        for i in range(9):
            logits = by_hand.step(fed)
            fed = logits.argmax(-1, keepdim=True)
            assert torch.equal(tokens[:, i:i + 1], fed), i
        with pytest.raises(ValueError, match="capacity=16 is full: the prompt and 10 steps fill it"):
            decoder.greedy(2)           # one step fits (position 15), the second does not
        with pytest.raises(ValueError, match=r"greedy\(\) needs StaticDecoder\(greedy=True\)"):
            by_hand.greedy(1)
        with pytest.raises(ValueError, match="only StaticDecoder\\(greedy=True\\)"):
            by_hand.step()
        with pytest.raises(ValueError, match="n=-1: expected a whole number"):
            decoder.greedy(-1)
    assert len(set(tokens.flatten().tolist())) > 3
    # one position for every layer, advanced once a step: the prompt's 6 and 10 steps
    assert all(layer.pos is decoder.pos for layer in decoder.cache) and int(decoder.pos) == 16


@pytest.mark.parametrize("scope", ["model", "blocks"])
def test_compiled_steps_are_specialized_to_their_shapes(monkeypatch, scope):
    """Both compile scopes ask for static shapes (dynamic=False): decoders of other lengths get kernels of their own
    instead of shape-generic ones."""
    asked = []

    def spy(fn=None, **kwargs):
        asked.append(kwargs)
        return fn
    monkeypatch.setattr(torch, "compile", spy)
    model = model_for("gpt2", dict(attention="exp"))
    with torch.no_grad():
        decoder = StaticDecoder(model, capacity=12, compile=True, compile_scope=scope)
        decoder.prefill(torch.zeros(1, 4, dtype=torch.long))
    assert asked and all(kwargs.get("dynamic") is False for kwargs in asked), asked


def test_constant_state_decoders_of_any_length_share_one_compiled_step(monkeypatch):
    """Greedy power decoders of three lengths compile the step once (their states do not grow; the token buffer's
    length is symbolic), one with room for a single step once more (torch specializes sizes of 1); exp decoders of
    two capacities compile it twice, each for its own KV cache (static shapes)."""
    from torch._dynamo.testing import CompileCounter
    compile_ = torch.compile
    counters = [CompileCounter()]  # one backend for every decoder, as inductor's equal wrappers are

    def counting(fn=None, options=None, **kwargs):  # options: inductor's, which a counting backend takes none of
        return compile_(fn, backend=counters[0], **kwargs)
    monkeypatch.setattr(torch, "compile", counting)
    torch._dynamo.reset()
    for case, shapes, compiles in ((dict(attention="power", p=2), [(5, 12), (7, 20), (4, 9), (3, 4)], 2),
                                   (dict(attention="exp"), [(5, 12), (7, 300)], 2)):
        model = model_for("gpt2", case)
        with torch.no_grad():
            for prompt, capacity in shapes:
                decoder = StaticDecoder(model, capacity=capacity, compile=True, greedy=True)
                first = decoder.prefill(torch.randint(0, VOCAB, (1, prompt))).argmax(-1, keepdim=True)
                decoder.greedy(capacity - prompt, first=first)
                assert decoder.compile_error is None, decoder.compile_error
        assert counters[0].frame_count == compiles, (case, counters[0].frame_count)
        counters[0] = CompileCounter()
        torch._dynamo.reset()


@pytest.mark.parametrize("bias", [True, False])
def test_row_linear_computes_what_linear_computes(bias):
    """RowLinear (the decoder's one-row torch.mm form) against x W^T + b in float64 for one row in any leading shape
    and for many rows (nn.Linear's own path); under bf16 autocast it returns what nn.Linear returns, in its dtype."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(16, 24, bias=bias, dtype=torch.float64)
    row = RowLinear(16, 24, bias=bias, dtype=torch.float64)
    row.load_state_dict(linear.state_dict())
    for shape in [(16,), (1, 16), (1, 1, 16), (3, 16), (2, 5, 16)]:
        x = torch.randn(shape, dtype=torch.float64)
        truth = x @ linear.weight.T + (linear.bias if bias else 0)
        y = row(x)
        assert y.shape == shape[:-1] + (24,)
        torch.testing.assert_close(y, truth, rtol=0, atol=1e-12)
    x = torch.randn(1, 1, 16)
    linear, row = linear.float(), row.float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = linear(x), row(x)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


def test_compiled_decoders_run_row_linears_on_their_own_copy(monkeypatch):
    """compile=True swaps every nn.Linear of the decoder's copy for RowLinear and leaves the caller's model alone;
    uncompiled or row_gemv=False decoders keep nn.Linear. A batch-1 greedy decode through the swapped copy (compiled
    by torch's eager backend here, so the test is quick) chooses the tokens recomputation does."""
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn=None, options=None, **kw: compile_(fn, backend="eager", **kw))
    torch._dynamo.reset()
    model = model_for("gpt2", dict(attention="power", p=2))
    linear_types = lambda m: {type(x) for x in m.modules() if isinstance(x, torch.nn.Linear)}  # noqa: E731
    assert linear_types(model) == {torch.nn.Linear}
    assert linear_types(StaticDecoder(model, capacity=8, compile=False).model) == {torch.nn.Linear}
    assert linear_types(StaticDecoder(model, capacity=8, compile=True, row_gemv=False).model) == {torch.nn.Linear}
    x = torch.randint(0, VOCAB, (1, 6))
    with torch.no_grad():
        decoder = StaticDecoder(model, capacity=14, compile=True, greedy=True)
        first = decoder.prefill(x).argmax(-1, keepdim=True)
        tokens = torch.cat([x, first, decoder.greedy(7, first=first)], dim=1)
    assert decoder.compile_error is None and linear_types(decoder.model) == {RowLinear}
    assert linear_types(model) == {torch.nn.Linear}
    assert torch.equal(tokens, model.generate(x, 8, temperature=0, use_cache=False))
    torch._dynamo.reset()
