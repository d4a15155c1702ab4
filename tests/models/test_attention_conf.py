"""The attention config group passes its keys through to the core: the short overrides as typed, errors naming the
key the user typed, output_norm from the command line, and model_spec of a composed config."""
import pytest

from longctx.models import build_model
from longctx.train.config import validate
from longctx.models import model_spec


@pytest.mark.parametrize("overrides, key, why", [
    (["attention=window", "window=0"], "window=0", "must be a positive integer"),
    (["attention=window", "attention.window=0"], "attention.window=0", "must be a positive integer"),
    (["attention=power", "p=7"], "p=7", "power attention supports integer degrees 1..4"),
    (["attention=power", "attention.chunk_size=-4"], "attention.chunk_size=-4", "must be a positive integer or null"),
    (["attention=power", "attention.output_norm=maybe"], "attention.output_norm='maybe'", "must be true or false"),
])
def test_bad_attention_values_name_the_key_typed(compose, overrides, key, why):
    with pytest.raises(ValueError) as err:
        validate(compose(*overrides))
    assert str(err.value) == f"config: {key}: {why}"


def test_conf_keys_reach_the_core(compose):
    cfg = compose("attention=power", "p=4", "attention.output_norm=true", "attention.chunk_size=64")
    validate(cfg)
    spec = model_spec(cfg, 5)
    assert spec.attention == "power"
    assert spec.attention_params == {"p": 4, "chunk_size": 64, "gating": True, "output_norm": True}
    core = build_model(spec).blocks[0].attn.core
    assert (core.p, core.chunk_size, core.out_norm is not None) == (4, 64, True)
    assert cfg.run_name.startswith("gpt2_power_p4_")
    assert model_spec(compose("attention=window", "window=16"), 5).attention_params == {"window": 16}
    assert model_spec(compose("attention=exp"), 5).attention_params == {"sink": False}
    sink = model_spec(compose("attention=exp", "attention.sink=true", "arch.rope_dims=4"), 5)
    assert (sink.attention_params, sink.rope_dims) == ({"sink": True}, 4)
    assert build_model(sink).blocks[0].attn.core.sink_logit.shape == (sink.n_heads,)
    assert model_spec(compose("attention=power"), 5).attention_params["output_norm"] is False  # the default
    shifted = model_spec(compose("arch.token_shift=true"), 5)
    assert shifted.token_shift and build_model(shifted).blocks[0].attn.shift_mix.shape == (3 * shifted.d_model,)
    assert model_spec(compose(), 5).token_shift is False  # the default


def test_linear_is_power_p1(compose):
    """attention=linear and attention=power p=1 are one computation (the recall suite runs p=1 as linear): the same
    parameters, the same outputs on CPU."""
    import torch

    linear = build_model(model_spec(compose("attention=linear"), 5)).double()
    power = build_model(model_spec(compose("attention=power", "p=1"), 5)).double()
    power.load_state_dict(linear.state_dict())  # strict: the same parameter names and shapes
    tokens = torch.randint(0, 5, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(linear(tokens), power(tokens), rtol=0, atol=1e-12)  # logits (b, t, vocab)
