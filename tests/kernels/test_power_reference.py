"""Reference power attention (CPU): float64 naive quadratic form -> reference forms -> pieces/state.

Error measure everywhere: relative Frobenius error ||y - y_ref|| / ||y_ref||.
"""
import pytest
import torch

from longctx.kernels import PowerState, power_attention, power_attention_step, state_dim
from longctx.kernels.power.reference import expand


def rel_err(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def naive(q, k, v, log_g, p, norm, scale=None):
    """Float64 quadratic form straight from the formula (no stabilization, no chunking)."""
    b, t, hq, d = q.shape
    rep = hq // k.shape[2]
    q, k, v = q.double(), k.double().repeat_interleave(rep, 2), v.double().repeat_interleave(rep, 2)
    s = (d ** -0.5 if scale is None else scale) * torch.einsum("bihd,bjhd->bhij", q, k)
    if log_g is None:
        gate = torch.zeros(t, t, dtype=torch.float64)
    else:
        G = log_g.double().cumsum(1).repeat_interleave(rep, 2).transpose(1, 2)   # (b,h,t)
        gate = G[..., :, None] - G[..., None, :]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    A = s.pow(p) * gate.masked_fill(~causal, float("-inf")).exp()
    y = torch.einsum("bhij,bjhd->bihd", A, v)
    return y / A.sum(-1).transpose(1, 2)[..., None] if norm else y


def inputs(b=2, t=63, hq=4, hk=2, d=16, gated=True, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, t, hq, d, generator=g, dtype=dtype)
    k = torch.randn(b, t, hk, d, generator=g, dtype=dtype)
    v = torch.randn(b, t, hk, d, generator=g, dtype=dtype)
    lg = -0.3 * torch.rand(b, t, hk, generator=g, dtype=torch.float32) if gated else None
    return q, k, v, lg


@pytest.mark.parametrize("p,norm", [(1, False), (2, True), (2, False), (3, False), (4, True)])
@pytest.mark.parametrize("chunk", [None, 16, 37])
@pytest.mark.parametrize("t", [63, 100])
def test_reference_matches_float64_quadratic(p, norm, chunk, t):
    q, k, v, lg = inputs(t=t)
    y = power_attention(q, k, v, lg, p=p, norm=norm, chunk_size=chunk)
    assert y.shape == q.shape and y.dtype == q.dtype
    assert rel_err(y, naive(q, k, v, lg, p, norm)) < 2e-5


@pytest.mark.parametrize("gated", [True, False])
def test_reference_gqa_and_scale(gated):
    q, k, v, lg = inputs(hq=6, hk=2, t=40, gated=gated)
    y = power_attention(q, k, v, lg, p=2, scale=0.3, chunk_size=8)
    assert rel_err(y, naive(q, k, v, lg, 2, True, scale=0.3)) < 2e-5


def test_expand_is_a_power_feature_map():
    x, y = torch.randn(5, 32, dtype=torch.float64), torch.randn(5, 32, dtype=torch.float64)
    for p in (1, 2, 3, 4):
        fx, fy = expand(x, p), expand(y, p, weighted=True)
        assert fx.shape[-1] == state_dim(p, 32)
        assert rel_err((fx * fy).sum(-1), (x * y).sum(-1).pow(p)) < 1e-12


@pytest.mark.parametrize("p,norm", [(2, True), (3, False)])
def test_reference_gradcheck_float64(p, norm):
    q, k, v, lg = inputs(b=1, t=9, hq=2, hk=1, d=4, dtype=torch.float64)
    lg = lg.double()
    _, st = power_attention(q[:, :3], k[:, :3], v[:, :3], lg[:, :3], p=p, norm=norm, return_state=True)
    leaves = [x.clone().requires_grad_() for x in (q[:, 3:], k[:, 3:], v[:, 3:], lg[:, 3:], st.s, st.z)]

    def f(q_, k_, v_, lg_, s_, z_):
        y, st2 = power_attention(q_, k_, v_, lg_, p=p, norm=norm, chunk_size=4,
                                 initial_state=PowerState(s_, z_), return_state=True)
        return y, st2.s, st2.z

    assert torch.autograd.gradcheck(f, leaves, atol=1e-6, rtol=1e-5, fast_mode=True)


@pytest.mark.parametrize("p,norm,chunk", [(2, True, None), (2, True, 16), (1, False, 8), (4, True, None)])
def test_pieces_with_state_equal_one_call(p, norm, chunk):
    q, k, v, lg = inputs(t=70)
    whole, st_whole = power_attention(q, k, v, lg, p=p, norm=norm, chunk_size=chunk, return_state=True)
    ys, st = [], None
    for a, b in ((0, 25), (25, 26), (26, 70)):
        y, st = power_attention(q[:, a:b], k[:, a:b], v[:, a:b], lg[:, a:b], p=p, norm=norm,
                                chunk_size=chunk, initial_state=st, return_state=True)
        ys.append(y)
    assert rel_err(torch.cat(ys, 1), whole) < 2e-5
    assert rel_err(st.s, st_whole.s) < 2e-5 and rel_err(st.z, st_whole.z) < 2e-5


def test_decoding_step_matches_one_call():
    q, k, v, lg = inputs(t=20)
    whole = power_attention(q, k, v, lg, p=2)
    _, st = power_attention(q[:, :12], k[:, :12], v[:, :12], lg[:, :12], return_state=True)
    out = []
    for i in range(12, 20):
        y, st = power_attention_step(q[:, i:i + 1], k[:, i:i + 1], v[:, i:i + 1], st, lg[:, i:i + 1])
        out.append(y)
    assert rel_err(torch.cat(out, 1), whole[:, 12:]) < 2e-5


def test_large_norm_gated_is_finite():
    q, k, v, lg = inputs(t=300, d=32)
    lg = lg * 20.0
    y = power_attention(q * 30, k * 30, v, lg, p=2, chunk_size=64)
    assert torch.isfinite(y).all()
    assert rel_err(y, naive(q * 30, k * 30, v, lg, 2, True)) < 1e-4


def test_zero_rows_are_finite():
    q, k, v, _ = inputs(t=10)
    y = power_attention(torch.zeros_like(q), k, v, p=2)
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("case,name", [
    (lambda q, k, v, lg: dict(q=q[0]), "q"),
    (lambda q, k, v, lg: dict(k=k[:, :5]), "k"),
    (lambda q, k, v, lg: dict(v=v[..., :8]), "v"),
    (lambda q, k, v, lg: dict(k=k.double(), v=v.double()), "dtype"),
    (lambda q, k, v, lg: dict(q=q.to(torch.int32)), "dtype"),
    (lambda q, k, v, lg: dict(p=3), "p=3"),
    (lambda q, k, v, lg: dict(p=0, norm=False), "p"),
    (lambda q, k, v, lg: dict(log_g=lg[:, :, :1]), "log_g"),
    (lambda q, k, v, lg: dict(q=q[:, :, :3]), "divide"),
    (lambda q, k, v, lg: dict(q=torch.randn(2, 10, 4, 512), k=torch.randn(2, 10, 2, 512),
                              v=torch.randn(2, 10, 2, 512), log_g=None), "head_dim"),
    (lambda q, k, v, lg: dict(chunk_size=0), "chunk_size"),
    (lambda q, k, v, lg: dict(initial_state=PowerState(torch.zeros(2, 2, 5, 16), torch.zeros(2, 2, 5))),
     "initial_state"),
])
def test_bad_inputs_raise_value_error(case, name):
    q, k, v, lg = inputs(t=10)
    kwargs = dict(q=q, k=k, v=v, log_g=lg)
    kwargs.update(case(q, k, v, lg))
    with pytest.raises(ValueError, match=name):
        power_attention(**kwargs)


def test_attention_form_tiles_per_kernel():
    """Each attention-form kernel takes its own tiles: an override of one backward kernel leaves the other and the
    forward alone, "bwd" sets both, and a bad kernel name is an error naming it."""
    import triton.language as tl
    from longctx.kernels.power import config
    from longctx.kernels.power import parallel as ta
    default = {kernel: ta.blocks(64, kernel, tl.bfloat16) for kernel in ta.KERNELS}
    with config.attention.override(block_override={"dq": (128, 32, 8, 2)}):
        assert ta.blocks(64, "dq", tl.bfloat16) == (128, 32, 8, 2)
        assert ta.blocks(64, "dkdv", tl.bfloat16) == default["dkdv"]
        assert ta.blocks(64, "fwd", tl.bfloat16) == default["fwd"]
    with config.attention.override(block_override={"dq": (128, 32, 8, 2), "bwd": (32, 32, 4, 2),
                                                   "fwd": (64, 64, 4, 2, 128)}):
        assert ta.blocks(64, "dkdv", tl.bfloat16) == (32, 32, 4, 2)
        assert ta.blocks(64, "dq", tl.bfloat16) == (128, 32, 8, 2)           # its own override wins
        cfg = ta.launch_config(64, "dq", tl.bfloat16, "tf32")
        assert (cfg["BM"], cfg["BN"], cfg["num_warps"], cfg["num_stages"], cfg["FAST"]) == (128, 32, 8, 2, True)
        assert "maxnreg" not in cfg                                           # 4 entries: no register cap
        assert ta.launch_config(64, "fwd", tl.bfloat16, "tf32")["maxnreg"] == 128   # a 5th entry caps the registers
    assert {kernel: ta.blocks(64, kernel, tl.bfloat16) for kernel in ta.KERNELS} == default   # restored
    with pytest.raises(TypeError, match="'block_overide'"):
        with config.attention.override(block_overide={}):
            pass
    with pytest.raises(ValueError, match="kernel='bwd'"):
        ta.blocks(64, "bwd", tl.bfloat16)


def test_attention_form_short_forward_tile():
    """The attention form's forward takes the tunables table's attn_fwd_short tile up to short_fwd_t tokens (d=64,
    bf16), its default tile above; the chunked form's intra-chunk forward, the backward kernels and other head dims
    never take it."""
    import triton.language as tl
    from longctx.kernels.power import config
    from longctx.kernels.power import parallel as ta, tunables
    cfg = config.attention.current()
    short, long_ = cfg.short_fwd_t, cfg.short_fwd_t + 1
    default = ta.blocks(64, "fwd", tl.bfloat16)
    assert ta.blocks(64, "fwd", tl.bfloat16, t=short) == tunables.tile("attn_fwd_short", 64, "bf16") != default
    assert ta.blocks(64, "fwd", tl.bfloat16, t=long_) == default
    assert ta.blocks(64, "fwd", tl.bfloat16, chunked=True, t=short) == ta.blocks(64, "fwd", tl.bfloat16, chunked=True)
    assert ta.blocks(64, "dq", tl.bfloat16, t=short) == ta.blocks(64, "dq", tl.bfloat16)
    assert ta.blocks(32, "fwd", tl.bfloat16, t=short) == ta.blocks(32, "fwd", tl.bfloat16)
    assert ta.blocks(64, "fwd", tl.float32, t=short) == ta.blocks(64, "fwd", tl.float32)
