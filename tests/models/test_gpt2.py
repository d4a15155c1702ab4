"""GPT-2 zoo on CPU at tiny size: spec checks, forward/backward per attention, causality, the loss head,
exp == a plain causal-softmax reference, the sliding-window forms, and the FLOP/state accounting."""
import math

import pytest
import torch
import torch.nn.functional as F

from longctx.kernels import state_dim
from longctx.models import ARCHITECTURES, ATTENTIONS, ModelSpec, build_model
from longctx.models.attention import build_attention
from longctx.models.attention.shared import mean_keys_per_query
from longctx.models.attention.window import blocked_window
from longctx.models.common import nll_sum, per_token_nll
from _checks import VOCAB, assert_causal, tiny_spec


def tiny(**kw):
    return tiny_spec("gpt2", **kw)


def attention_params():
    return [pytest.param(name, id=name) for name in sorted(ATTENTIONS)]


def core(name, spec, **params):
    """The core `name` with `params`, sized by `spec`."""
    return build_attention(ModelSpec(**(spec.__dict__ | dict(attention=name, attention_params=params))))


# -- spec ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, field, words", [
    (dict(arch="mamba"), "ModelSpec.arch", sorted(ARCHITECTURES)),
    (dict(positions="alibi"), "ModelSpec.positions", ["rotary, learned"]),
    (dict(activation="relu"), "ModelSpec.activation", ["gelu, gelu_tanh"]),
    (dict(n_kv_heads=2), "ModelSpec.n_kv_heads", ["llama"]),
    (dict(arch="llama", n_heads=4, n_kv_heads=3), "ModelSpec.n_kv_heads", ["dividing n_heads=4"]),
    (dict(arch="llama", positions="learned"), "ModelSpec.positions", ["gpt2"]),
    (dict(arch="llama", norm_eps=0), "ModelSpec.norm_eps", ["(0, 1)"]),
    (dict(d_model=30, n_heads=4), "ModelSpec.d_model", ["n_heads"]),
    (dict(n_layers=0), "ModelSpec.n_layers", []),
    (dict(attention="flash"), "attention.name", sorted(ATTENTIONS)),
    (dict(attention="power", p=5), "attention.p", ["1..4"]),
    (dict(attention="power", p=0), "attention.p", []),
    (dict(attention="window", window=0), "attention.window", ["positive integer"]),
    (dict(attention="power", chunk_size=0), "attention.chunk_size", []),
    (dict(attention="linear", gating="yes"), "attention.gating", ["true or false"]),
    (dict(attention="power", output_norm=1), "attention.output_norm", []),
])
def test_bad_spec_names_the_field(kw, field, words):
    with pytest.raises(ValueError) as err:
        tiny(**kw)
    assert str(err.value).startswith(f"{field}=")
    for w in words:
        assert w in str(err.value)


def test_attention_params_are_declared_by_the_core():
    spec = ModelSpec(attention="power", attention_params={"p": 4})
    assert spec.attention_params == {"p": 4, "chunk_size": None, "gating": True, "output_norm": False}
    with pytest.raises(ValueError, match=r"^attention.window=8: not a parameter of attention=exp \(its parameters: sink\)"):
        ModelSpec(attention="exp", attention_params={"window": 8})
    with pytest.raises(ValueError, match=r"attention.chunk=8: .*p, chunk_size, gating, output_norm"):
        ModelSpec(attention="power", attention_params={"chunk": 8})


def test_old_flat_spec_maps_to_attention_params():
    """Checkpoints saved before attention_params held p/window/chunk_size/gating as fields of the spec."""
    old = dict(arch="gpt2", attention="power", vocab_size=50304, d_model=64, n_layers=2, n_heads=2, mlp_ratio=4,
               ctx=128, p=2, window=1024, chunk_size=None, gating=True, rope_base=10000.0,
               checkpoint_activations=False)
    spec = ModelSpec.from_dict(old)
    assert spec.attention_params == {"p": 2, "chunk_size": None, "gating": True, "output_norm": False}
    assert ModelSpec.from_dict(old | dict(attention="window")).attention_params == {"window": 1024}
    assert ModelSpec.from_dict(old | dict(attention="exp")).attention_params == {"sink": False}
    assert ModelSpec.from_dict(spec.__dict__) == spec  # today's layout round-trips
    with pytest.raises(ValueError, match="ModelSpec.colour='red': not a field"):
        ModelSpec.from_dict(old | dict(colour="red"))


def test_every_attention_module_registers_itself():
    """One module per attention in models/attention/, each registered under its conf file's name."""
    from pathlib import Path
    import longctx.models.attention as package
    conf = Path(__file__).resolve().parents[2] / "conf" / "attention"
    assert ATTENTIONS and set(ATTENTIONS) == {p.stem for p in conf.glob("*.yaml")}
    for name, cls in ATTENTIONS.items():
        assert Path(package.__file__).with_name(f"{name}.py").exists() and cls.name == name


# -- forward / backward -----------------------------------------------------------------------------------

@pytest.mark.parametrize("attention", attention_params())
def test_forward_backward_finite(attention):
    torch.manual_seed(0)
    model = build_model(tiny(attention=attention))
    x = torch.randint(0, VOCAB, (2, 19))  # 19: not a multiple of the window or the chunk
    nll = model(x, torch.roll(x, -1, 1))
    assert nll.shape == (2, 19) and nll.dtype == torch.float32 and torch.isfinite(nll).all()
    assert abs(nll.mean().item() - math.log(VOCAB)) < 0.5  # near-uniform predictions at init
    nll.mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize("attention", attention_params())
def test_causal(attention):
    torch.manual_seed(0)
    model = build_model(tiny(attention=attention)).eval()
    assert_causal(model, VOCAB, min_change=1e-4)


@pytest.mark.parametrize("attention", attention_params())
def test_per_token_nll_is_cross_entropy_of_logits(attention):
    torch.manual_seed(0)
    model = build_model(tiny(attention=attention)).eval()
    x = torch.randint(0, VOCAB, (3, 17))
    t = torch.randint(0, VOCAB, (3, 17))
    with torch.no_grad():
        logits = model(x)
        nll = model(x, t)
    ref = F.cross_entropy(logits.float().reshape(-1, VOCAB), t.reshape(-1), reduction="none").view(3, 17)
    torch.testing.assert_close(nll, ref, rtol=1e-5, atol=1e-5)


def test_chunked_loss_head_matches_plain():
    torch.manual_seed(0)
    h = torch.randn(2, 50, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(VOCAB, 16, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, VOCAB, (2, 50))
    g = torch.randn(2, 50, dtype=torch.float64)
    ref = F.cross_entropy(h.reshape(-1, 16) @ w.T, t.reshape(-1), reduction="none").view(2, 50)
    dh, dw = torch.autograd.grad((ref * g).sum(), (h, w))
    out = per_token_nll(h, w, t, chunk_tokens=7)
    dh2, dw2 = torch.autograd.grad((out * g).sum(), (h, w))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref.float())
    torch.testing.assert_close(dh2, dh, rtol=1e-5, atol=1e-5)  # the CE itself runs in fp32
    torch.testing.assert_close(dw2, dw, rtol=1e-5, atol=1e-5)


def test_summed_loss_head_matches_float64_sum_and_gradients():
    """nll_sum forms the gradients in its forward and scales them by the incoming gradient: the sum of the float64
    cross-entropies and its gradients times that scale (chunks of 7 over 100 tokens: a remainder chunk too)."""
    torch.manual_seed(0)
    h = torch.randn(2, 50, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(VOCAB, 16, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, VOCAB, (2, 50))
    ref = F.cross_entropy(h.reshape(-1, 16) @ w.T, t.reshape(-1), reduction="sum")
    dh, dw = torch.autograd.grad(0.37 * ref, (h, w))
    out = nll_sum(h, w, t, chunk_tokens=7)
    dh2, dw2 = torch.autograd.grad(0.37 * out, (h, w))
    assert out.dtype == torch.float32 and out.shape == ()
    torch.testing.assert_close(out, ref.float())
    torch.testing.assert_close(dh2, dh, rtol=1e-5, atol=1e-6)  # the CE itself runs in fp32
    torch.testing.assert_close(dw2, dw, rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # no gradients wanted: the plain chunked sum
        torch.testing.assert_close(nll_sum(h, w, t, chunk_tokens=7), ref.float())


def test_model_summed_loss_trains_like_the_per_token_loss():
    """reduction="sum" (the trainer's) gives the per-token losses' sum and the same parameter gradients; a bad value
    is named."""
    torch.manual_seed(0)
    model = build_model(tiny(attention="power"))
    x, t = torch.randint(0, VOCAB, (2, 33)), torch.randint(0, VOCAB, (2, 33))
    per_token = model(x, t)
    ref = torch.autograd.grad(per_token.sum(), list(model.parameters()))
    total = model(x, t, reduction="sum")
    got = torch.autograd.grad(total, list(model.parameters()))
    torch.testing.assert_close(total, per_token.sum())
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="reduction='mean'"):
        model(x, t, reduction="mean")


def test_activation_checkpointing_same_gradients():
    x = torch.randint(0, VOCAB, (2, 16))
    grads = []
    for ckpt in (False, True):
        torch.manual_seed(0)
        model = build_model(tiny(attention="exp", checkpoint_activations=ckpt))
        model(x, x).mean().backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


# -- exp == plain causal softmax ----------------------------------------------------------------------------

class ReferenceSoftmax(torch.nn.Module):
    def forward(self, q, k, v, x=None):  # (b, t, h, d)
        d, t = q.shape[-1], q.shape[1]
        scores = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(d)
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        return torch.einsum("bhij,bjhd->bihd", scores.softmax(-1), v)


def test_exp_matches_plain_softmax_reference():
    torch.manual_seed(0)
    model = build_model(tiny(attention="exp")).double().eval()
    x = torch.randint(0, VOCAB, (2, 21))
    with torch.no_grad():
        ours = model(x)
        for block in model.blocks:
            block.attn.core = ReferenceSoftmax()
        ref = model(x)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)


# -- window -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("t, w", [(1, 4), (7, 3), (16, 4), (23, 5), (40, 1)])
def test_blocked_window_matches_dense_band(t, w):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, t, 8, dtype=torch.float64) for _ in range(3))  # (b, h, t, d)
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    band = (j <= i) & (i - j < w)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=band)
    torch.testing.assert_close(blocked_window(q, k, v, w), ref)


def test_window_equals_exp_when_window_covers_context():
    torch.manual_seed(0)
    model = build_model(tiny(attention="window", window=64)).eval()
    x = torch.randint(0, VOCAB, (1, 30))
    with torch.no_grad():
        a = model(x)
        for block in model.blocks:
            block.attn.core = core("exp", model.spec)
        b = model(x)
    torch.testing.assert_close(a, b)


# -- accounting ---------------------------------------------------------------------------------------------

def test_gpt2_small_accounting():
    spec = ModelSpec(vocab_size=50304, d_model=768, n_layers=12, n_heads=12, attention="exp")
    with torch.device("meta"):  # shapes only
        model = build_model(spec)
    fl = model.flops_per_token(8192)
    # 12 d^2 per layer (qkv 3, proj 1, mlp 8) + the tied LM head d * vocab
    assert fl["weight"] == 2 * (12 * 12 * 768 ** 2 + 768 * 50304)
    assert fl["state"] == 12 * 4 * 768 * (8192 + 1) / 2
    assert model.state_size(8192) == 12 * 2 * 8192 * 768


def test_window_and_power_accounting():
    assert mean_keys_per_query(10, 100) == 5.5
    assert mean_keys_per_query(4, 2) == (1 + 2 + 2 + 2) / 4
    win = core("window", tiny(), window=5)
    assert win.state_size(100) == 2 * 5 * 32 and win.state_size(3) == 2 * 3 * 32
    # D is the kernel's tiled symmetric power: C(d/tile + p - 1, p) * tile^p (DESIGN.md), >= C(d + p - 1, p)
    for p in (1, 2, 3, 4):
        power = core("power", tiny(), p=p)  # head_dim 16
        D = state_dim(p, 16)
        assert power.expanded_dim == D >= math.comb(16 + p - 1, p)
        assert power.state_size(10 ** 6) == 2 * D * (16 + (p % 2 == 0))
        assert power.state_flops(10 ** 6) == 4 * power.state_size(10 ** 6)
    assert core("power", ModelSpec(d_model=768, n_heads=12), p=2).expanded_dim == state_dim(2, 64)


# -- power: every degree runs, the gate starts near 1, the core is the formula of DESIGN.md -----------------

@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_power_every_degree_trains(p):
    torch.manual_seed(0)
    model = build_model(tiny(attention="power", p=p, chunk_size=None))
    x = torch.randint(0, VOCAB, (2, 11))
    loss = model(x, x).mean()
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(q.grad).all() for q in model.parameters())
    assert (model.blocks[0].attn.core.out_norm is None) == (p % 2 == 0)


def test_gate_starts_near_one():
    power = core("power", tiny())
    log_g = power.gate(torch.nn.functional.layer_norm(torch.randn(2, 9, 32), (32,)))
    assert log_g.dtype == torch.float32 and log_g.shape == (2, 9, 2)
    assert (log_g < 0).all() and (log_g > -1e-2).all()


@pytest.mark.parametrize("p, output_norm", [(1, False), (2, False), (3, False), (4, False), (2, True), (4, True)])
def test_power_core_is_the_gated_formula(p, output_norm):
    torch.manual_seed(0)
    spec = tiny(attention="power", p=p, d_model=32, n_heads=2, output_norm=output_norm)
    power = build_attention(spec).double()
    assert (power.out_norm is not None) == (output_norm or p % 2 == 1)  # odd p always normalize their output
    with torch.no_grad():
        power.gate.bias.fill_(1.0)  # strong forgetting, so the gate matters
        if power.out_norm is not None:
            power.out_norm.weight.uniform_(0.5, 1.5)
    b, t, h, d = 2, 13, 2, 16
    q, k, v = (torch.randn(b, t, h, d, dtype=torch.float64) for _ in range(3))
    x = torch.randn(b, t, 32, dtype=torch.float64)
    with torch.no_grad():
        y = power(q, k, v, x)
        G = power.gate(x).double().cumsum(1)                                          # (b, t, h)
        A = (torch.einsum("bihd,bjhd->bhij", q, k) / d ** 0.5) ** p
        A = A * torch.exp(G.transpose(1, 2)[..., :, None] - G.transpose(1, 2)[..., None, :])
        A = A.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), 0)
        if p % 2 == 0:
            A = A / A.sum(-1, keepdim=True)
        ref = torch.einsum("bhij,bjhd->bihd", A, v)
        if power.out_norm is not None:  # RMSNorm over each head's d outputs, learnable scale
            ref = ref * torch.rsqrt(ref.pow(2).mean(-1, keepdim=True) + 1e-6) * power.out_norm.weight
    torch.testing.assert_close(y, ref, rtol=1e-6, atol=1e-6)
