"""State accounting against the paper's numbers and the models' own counts."""
import pytest
from omegaconf import OmegaConf

import longctx  # noqa: F401  (registers the resolver)
from longctx.state import equal_state_window, power_dim, state_per_layer


def test_the_papers_dimensions_and_windows():
    # D = C(d + p - 1, p); the paper: p=2 multiplies a head-64 state by ~32, p=3 by ~700, p=4 by ~12000
    assert power_dim(2, 64) == 2080 and power_dim(3, 64) == 45760 and power_dim(4, 64) == 766480
    for p, factor in ((2, 32), (3, 700), (4, 12000)):
        assert power_dim(p, 64) / 64 == pytest.approx(factor, rel=0.03)
    assert equal_state_window(2, 64) == 1040          # w (d + v) = D v
    assert equal_state_window(1, 64) == 32            # linear's d x v
    assert power_dim(2, 64, "tiled") == 2304 and equal_state_window(2, 64, "tiled") == 1170


@pytest.mark.parametrize("attention, kwargs, want", [
    ("exp", {}, 12 * 4096 * 128),
    ("window", {"window": 1040}, 12 * 1040 * 128),
    ("window", {"window": 8192}, 12 * 4096 * 128),     # a window longer than the context holds the context
    ("linear", {}, 12 * 64 * 64),
    ("power", {"p": 2}, 12 * 2080 * 64),
])
def test_state_per_layer_follows_the_definitions(attention, kwargs, want):
    assert state_per_layer(attention, d_model=768, n_heads=12, ctx=4096, **kwargs) == want


def test_equal_state_arms_hold_equal_state():
    w = equal_state_window(2, 64)
    power = state_per_layer("power", d_model=768, n_heads=12, ctx=4096, p=2)
    window = state_per_layer("window", d_model=768, n_heads=12, ctx=4096, window=w)
    assert abs(window - power) / power < 1 / w               # equal up to the rounding of w


def test_tiled_counts_what_the_models_report():
    torch = pytest.importorskip("torch")
    from longctx.models.attention.power import PowerAttention

    core = PowerAttention.__new__(PowerAttention)
    torch.nn.Module.__init__(core)
    core.n_heads, core.head_dim, core.p, core.norm = 12, 64, 2, True
    assert core.state_size(4096) == state_per_layer("power", d_model=768, n_heads=12, ctx=4096, p=2,
                                                    definition="tiled")


def test_configs_derive_windows_and_bad_input_names_the_field():
    cfg = OmegaConf.create({"p": 2, "window": "${longctx.equal_state_window:${p},64}"})
    assert cfg.window == 1040
    with pytest.raises(ValueError, match="definition='exact'"):
        equal_state_window(2, 64, "exact")
    with pytest.raises(ValueError, match="model.d_model=100 is not a multiple of model.n_heads=12"):
        state_per_layer("exp", d_model=100, n_heads=12, ctx=8)
