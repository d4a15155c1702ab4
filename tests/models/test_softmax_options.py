"""Softmax attention's learned sink and the partial rotary embedding, against float64 definitions written here."""
import math

import pytest
import torch

from longctx.models import build_model
from longctx.models.attention.exp import ExpAttention
from longctx.models.common import rotary, rotary_tables
from longctx.models.spec import ModelSpec
from _checks import VOCAB, tiny_spec


def softmax_with_sink_reference(q, k, v, logit):
    """Causal softmax whose denominator also holds exp(logit[h]): (b, t, h, d) float64."""
    t, d = q.shape[1], q.shape[-1]
    scores = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(d)
    scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), -math.inf)
    sink = logit[None, :, None, None].expand(q.shape[0], -1, t, 1)
    weights = torch.cat([sink, scores], -1).softmax(-1)[..., 1:]
    return torch.einsum("bhij,bjhd->bihd", weights, v)


def sink_core(h=3, d=8, logit=None):
    spec = ModelSpec(attention="exp", attention_params={"sink": True}, d_model=h * d, n_heads=h, n_layers=1,
                     vocab_size=VOCAB)
    core = ExpAttention(spec, ExpAttention.Params(sink=True)).double()
    if logit is not None:
        with torch.no_grad():
            core.sink_logit.copy_(logit)
    return core


def test_sink_equals_its_definition_and_learns():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 7, 3, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    logit = torch.tensor([-1.0, 0.5, 3.0], dtype=torch.float64)
    core = sink_core(logit=logit)
    y = core(q, k, v)
    torch.testing.assert_close(y, softmax_with_sink_reference(q, k, v, logit), rtol=0, atol=1e-12)
    grads = torch.autograd.grad(y.square().sum(), (q, k, v, core.sink_logit))
    assert grads[-1].abs().min() > 0  # every head's logit gets a gradient
    free = logit.clone().requires_grad_()
    ref = torch.autograd.grad(softmax_with_sink_reference(q, k, v, free).square().sum(), (q, k, v, free))
    for got, want in zip(grads, ref):  # the padded, in-place built inputs pass every gradient through
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_a_very_negative_sink_is_plain_softmax_and_a_large_one_silences_the_head():
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 5, 3, 8, dtype=torch.float64) for _ in range(3))
    off = sink_core(logit=torch.full((3,), -60.0, dtype=torch.float64))(q, k, v)
    torch.testing.assert_close(off, softmax_with_sink_reference(q, k, v, torch.full((3,), -math.inf,
                                                                                    dtype=torch.float64)))
    loud = sink_core(logit=torch.full((3,), 60.0, dtype=torch.float64))(q, k, v)
    assert loud.abs().max() < 1e-20


def test_partial_rotary_turns_the_first_dims_and_keeps_the_rest():
    torch.manual_seed(2)
    x = torch.randn(1, 6, 2, 16, dtype=torch.float64)
    y = rotary(x, tuple(z.double() for z in rotary_tables(6, 8, 10000.0)))
    torch.testing.assert_close(y[..., 8:], x[..., 8:], rtol=0, atol=0)
    torch.testing.assert_close(y[..., :8], rotary(x[..., :8], tuple(z.double() for z in rotary_tables(6, 8, 10000.0))))
    # rotate-half by hand: pair (i, i + 4) of the first 8 dims turned by position * base ** (-2i / 8)
    pos = torch.arange(6, dtype=torch.float64)[None, :, None]
    for i in range(4):
        a = pos * 10000.0 ** (-2 * i / 8)
        torch.testing.assert_close(y[..., i], x[..., i] * a.cos() - x[..., i + 4] * a.sin())
    # the unturned dims score the same at every distance: a content match that no position changes
    q = torch.zeros(1, 6, 1, 16, dtype=torch.float64)
    q[..., 12] = 1.0
    tables = rotary_tables(6, 8, 10000.0)
    assert torch.equal(rotary(q, tables), q)


@pytest.mark.parametrize("arch", ["gpt2", "rwkv7"])
def test_models_build_and_run_with_partial_rotary(arch):
    model = build_model(tiny_spec(arch, rope_dims=4)).eval()
    with torch.no_grad():
        logits = model(torch.randint(0, VOCAB, (1, 9)))
    assert logits.shape == (1, 9, VOCAB) and torch.isfinite(logits).all()


@pytest.mark.parametrize("bad", [3, 0, 18, True, 2.0])
def test_bad_rope_dims_name_the_field(bad):
    with pytest.raises(ValueError, match=r"ModelSpec.rope_dims=.*even integer in \[2, head_dim=16\]"):
        tiny_spec("gpt2", rope_dims=bad)


def test_bad_sink_names_the_parameter():
    with pytest.raises(ValueError, match=r"attention.sink='yes': must be true or false"):
        tiny_spec("gpt2", attention="exp", sink="yes")
