"""RWKV7 on CPU at tiny size: the native rule against FLA's naive recurrence, causality and finite gradients for
every attention slot, and a few training steps for every arch x attention pair."""
import math

import pytest
import torch

from longctx.models import ATTENTIONS, build_model
from longctx.models.rwkv7 import LOG_DECAY_MIN, rwkv7_chunked, rwkv7_recurrent, to_fla
from _checks import VOCAB, assert_causal, model_cases, native_attention, perturb_, tiny_spec

NATIVE = native_attention("rwkv7")  # the attention name RWKV-7's own time mixing serves (conf: attention=linear)


def tiny(**kw):
    return tiny_spec("rwkv7", **kw)


def test_native_rule_matches_fla_naive_recurrence():
    dplr = pytest.importorskip("fla.ops.generalized_delta_rule.dplr.naive")
    torch.manual_seed(0)
    b, t, h, d = 2, 11, 3, 8
    r, k, v = (torch.randn(b, t, h, d) for _ in range(3))
    w = -0.6 * torch.rand(b, t, h, d)
    kk = torch.nn.functional.normalize(torch.randn(b, t, h, d), dim=-1)
    a_rate = torch.rand(b, t, h, d)
    ours = rwkv7_recurrent(r, w, k, v, -kk, kk * a_rate)
    tr = lambda z: z.transpose(1, 2)  # noqa: E731  FLA's naive form is (b, h, t, d) and scales q by d^-1/2
    ref, _ = dplr.dplr_recurrence(tr(r) * d ** 0.5, tr(k), tr(v), tr(-kk), tr(kk * a_rate), tr(w))
    torch.testing.assert_close(ours, tr(ref), rtol=1e-5, atol=1e-5)  # both fp32


@pytest.mark.parametrize("t, chunk", [(1, 32), (7, 4), (32, 32), (45, 16), (100, 32)])
def test_chunked_rule_matches_recurrence(t, chunk):
    """The CPU engine (chunked) against the token-by-token recurrence: outputs and all six input gradients."""
    torch.manual_seed(0)
    b, h, d = 2, 2, 8
    w = (LOG_DECAY_MIN * torch.rand(b, t, h, d)).requires_grad_()
    kk = torch.nn.functional.normalize(torch.randn(b, t, h, d), dim=-1)
    a = (-kk).requires_grad_()
    bb = (kk * torch.rand(b, t, h, d)).requires_grad_()
    r, k, v = (torch.randn(b, t, h, d, requires_grad=True) for _ in range(3))
    g = torch.randn(b, t, h, d)
    inputs = (r, w, k, v, a, bb)
    ref = rwkv7_recurrent(*inputs)
    out = rwkv7_chunked(*inputs, chunk=chunk)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    for name, x, y in zip("rwkvab", torch.autograd.grad((out * g).sum(), inputs),
                          torch.autograd.grad((ref * g).sum(), inputs)):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4, msg=f"d{name}")


@pytest.mark.parametrize("attention", sorted(ATTENTIONS))
def test_rwkv7_forward_backward_finite(attention):
    torch.manual_seed(0)
    model = build_model(tiny(attention=attention))
    x = torch.randint(0, VOCAB, (2, 19))
    nll = model(x, torch.roll(x, -1, 1))
    assert nll.shape == (2, 19) and nll.dtype == torch.float32
    assert abs(nll.mean().item() - math.log(VOCAB)) < 0.5
    nll.mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize("attention", sorted(ATTENTIONS))
def test_rwkv7_causal(attention):
    torch.manual_seed(0)
    model = perturb_(build_model(tiny(attention=attention)), 0.05).eval()
    assert_causal(model, VOCAB, min_change=1e-5)


def test_rwkv7_native_has_fla_parameter_names():
    names = set(n for n, _ in build_model(tiny(attention=NATIVE, n_layers=2)).named_parameters())
    for n in ["embeddings.weight", "layers.0.pre_norm.weight", "layers.1.attn.x_r",
              "layers.1.attn.w_lora.lora.0.weight",
              "layers.1.attn.v_lora.lora.2.bias", "layers.1.attn.g_norm.bias", "layers.1.attn.r_k",
              "layers.1.ffn.x_k", "layers.1.ffn.key.weight", "norm.weight", "lm_head.weight"]:
        assert n in names, n


@pytest.mark.filterwarnings("ignore:According to Bo")
def test_weights_load_into_fla_rwkv7():
    """Every parameter maps one-to-one onto fla.models.RWKV7ForCausalLM (strict load, same shapes).
    The logits are compared on GPU (tests/models/test_models_gpu.py): FLA's model runs only there."""
    pytest.importorskip("fla.models")
    ours = perturb_(build_model(tiny(attention=NATIVE, d_model=64, n_layers=3)), 0.05)
    theirs = to_fla(ours)
    assert sum(p.numel() for p in theirs.parameters()) == sum(p.numel() for p in ours.parameters())
    torch.testing.assert_close(theirs.model.layers[2].attn.w_lora.lora[2].bias, ours.layers[2].attn.w_lora.lora[2].bias)
    other = next(a for a in sorted(ATTENTIONS) if a != NATIVE)
    with pytest.raises(ValueError, match=f"attention='{other}'"):
        to_fla(build_model(tiny(attention=other)))


@pytest.mark.parametrize("arch, attention", model_cases())
def test_every_pair_trains(arch, attention):
    torch.manual_seed(0)
    window = dict(window=8) if attention == "window" else {}
    spec = tiny_spec(arch, attention=attention, ctx=32, checkpoint_activations=(attention == "power"), **window)
    model = build_model(spec)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x = torch.randint(0, VOCAB, (4, 32))
    inputs, targets = x, torch.roll(x, -1, 1)
    losses = []
    for _ in range(6):
        loss = model(inputs, targets).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0] - 0.05, losses
