"""GPT-2's token shift (`arch.token_shift`): q, k and v read a learned per-channel mix of each position and its
predecessor. Against a float64 projection written here, the plain block at mu = 0, cached decoding, and bad values."""
import pytest
import torch

from longctx.models import build_model
from longctx.models.gpt2 import SelfAttention
from _checks import VOCAB, assert_cached_equals_full, perturb_, tiny_spec


def shifted_projection_reference(x, weight, bias, mu):
    """(b, t, d) float64 -> (b, t, 3d): projection j of x_t + mu_j * (x_{t-1} - x_t), x_{-1} = 0."""
    d = x.shape[-1]
    prev = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], 1)
    outs = [(x + mu[j] * (prev - x)) @ weight[j * d:(j + 1) * d].T + bias[j * d:(j + 1) * d] for j in range(3)]
    return torch.cat(outs, -1)


def test_shifted_projection_equals_its_definition_and_learns_from_zero():
    torch.manual_seed(0)
    attn = SelfAttention(tiny_spec("gpt2", token_shift=True)).double()
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    assert attn.shift_mix.abs().max() == 0                      # starts as the plain block
    grad = torch.autograd.grad(attn.project(x).square().sum(), attn.shift_mix)[0]
    assert grad.abs().min() > 0                                  # every channel of q, k and v can learn to shift
    with torch.no_grad():
        attn.shift_mix.copy_(torch.randn(96, dtype=torch.float64))
    want = shifted_projection_reference(x, attn.qkv.weight, attn.qkv.bias, attn.shift_mix.view(3, 32))
    torch.testing.assert_close(attn.project(x), want, rtol=0, atol=1e-12)


def test_shifted_projection_keeps_the_autocast_dtype():
    """Under bf16 autocast q, k and v come out in bf16 as the plain block's (an fp32 bias once promoted them to
    fp32, and power attention then ran its fp32 kernels: 5x slower), and equal the fp32 definition to bf16's
    rounding."""
    torch.manual_seed(3)
    attn = SelfAttention(tiny_spec("gpt2", token_shift=True))
    with torch.no_grad():
        attn.shift_mix.copy_(torch.randn(96))
    x = torch.randn(2, 6, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain, shifted = attn.qkv(x), attn.project(x)
    assert plain.dtype == shifted.dtype == torch.bfloat16
    want = shifted_projection_reference(x.double(), attn.qkv.weight.double(), attn.qkv.bias.double(),
                                        attn.shift_mix.double().view(3, 32))
    err = (shifted.double() - want).norm() / want.norm()
    assert err < 1e-2


def test_zero_mix_is_the_plain_model():
    torch.manual_seed(1)
    shifted = build_model(tiny_spec("gpt2", token_shift=True)).eval()
    plain = build_model(tiny_spec("gpt2")).eval()
    missing, unexpected = plain.load_state_dict(shifted.state_dict(), strict=False)
    assert not missing and all(k.endswith("shift_mix") for k in unexpected) and len(unexpected) == 2
    x = torch.randint(0, VOCAB, (2, 11))
    with torch.no_grad():
        torch.testing.assert_close(shifted(x), plain(x), rtol=0, atol=0)


def test_cached_decoding_continues_the_shift():
    """A 5-token prompt, then one token at a time: each position's logits equal one forward over the whole
    sequence, so the cache hands each call the previous call's last token."""
    torch.manual_seed(2)
    model = perturb_(build_model(tiny_spec("gpt2", token_shift=True)), 0.3, seed=2).eval()
    assert model.blocks[0].attn.shift_mix.abs().min() > 0
    assert_cached_equals_full(model, torch.randint(0, VOCAB, (2, 12)), prompt=5, atol=1e-5)


@pytest.mark.parametrize("arch, value, words", [("gpt2", "yes", "must be true or false"),
                                                ("rwkv7", True, "is GPT-2's option")])
def test_bad_token_shift_names_the_field(arch, value, words):
    with pytest.raises(ValueError, match=rf"ModelSpec.token_shift={value!r}: {words}"):
        tiny_spec(arch, token_shift=value)
