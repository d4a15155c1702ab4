"""GPU tests of the Triton power-attention kernels vs the float64 reference (run on a CUDA device).

Error measure: relative Frobenius error ||x - x_ref|| / ||x_ref|| of the output and of every gradient,
the reference evaluated in float64 on the same (rounded) inputs.
"""
import itertools

import pytest
import torch

from longctx.kernels import power_attention
from longctx.kernels.power.reference import power_attention_reference

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

TOL = {torch.bfloat16: 1e-2, torch.float16: 5e-3, torch.float32: 1e-4}
PNORM = [(1, False), (2, True), (2, False), (3, False), (4, True), (4, False)]
CASES = [(p, norm, d, dt, (i % 2 == 0))
         for i, ((p, norm), d, dt) in enumerate(itertools.product(
             PNORM, (32, 64, 128), (torch.bfloat16, torch.float16, torch.float32)))]


def rel_err(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def make(b, t, hq, hk, d, dtype, gated, seed=0, qk_scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = (qk_scale * torch.randn(b, t, hq, d, device="cuda", generator=g)).to(dtype)
    k = (qk_scale * torch.randn(b, t, hk, d, device="cuda", generator=g)).to(dtype)
    v = torch.randn(b, t, hk, d, device="cuda", generator=g).to(dtype)
    lg = (-0.5 * torch.rand(b, t, hk, device="cuda", generator=g)) if gated else None
    return q, k, v, lg


@pytest.mark.parametrize("p,norm,d,dtype,gated", CASES,
                         ids=[f"p{p}-{'norm' if n else 'raw'}-d{d}-{str(dt)[6:]}-{'gated' if g else 'nogate'}"
                              for p, n, d, dt, g in CASES])
def test_kernel_matches_float64_reference(p, norm, d, dtype, gated):
    q, k, v, lg = make(2, 777, 4, 2, d, dtype, gated)
    leaves = [x.requires_grad_() for x in (q, k, v) + ((lg,) if gated else ())]
    y = power_attention(q, k, v, lg, p=p, norm=norm)
    assert y.dtype == dtype and torch.isfinite(y).all()
    do = torch.randn_like(y)
    grads = torch.autograd.grad(y, leaves, do)
    ref_leaves = [x.detach().double().requires_grad_() for x in leaves]
    qr, kr, vr = ref_leaves[:3]
    y_ref = power_attention_reference(qr, kr, vr, ref_leaves[3] if gated else None, p=p, norm=norm)
    grads_ref = torch.autograd.grad(y_ref, ref_leaves, do.double())
    tol = TOL[dtype]
    assert rel_err(y, y_ref) < tol
    for name, g_, gr in zip("q k v log_g".split(), grads, grads_ref):
        assert rel_err(g_, gr) < 2 * tol, name


@pytest.mark.parametrize("draw", range(4))
def test_64k_bf16_gated_large_norm_is_finite(draw):
    q, k, v, lg = make(1, 65536, 2, 1, 64, torch.bfloat16, True, seed=draw, qk_scale=8.0 * (draw + 1))
    lg = (lg * (1 + 20 * draw)).requires_grad_()
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    y = power_attention(q, k, v, lg, p=2)
    y.backward(torch.randn_like(y))
    for x in (y, q.grad, k.grad, v.grad, lg.grad):
        assert torch.isfinite(x).all()


@pytest.mark.parametrize("p,norm", [(2, True), (1, False)])
def test_pieces_with_state_equal_one_call_gpu(p, norm):
    q, k, v, lg = make(1, 3000, 4, 2, 64, torch.float32, True)
    whole = power_attention(q, k, v, lg, p=p, norm=norm)
    ys, st = [], None
    for a, b in ((0, 1024), (1024, 1025), (1025, 3000)):
        y, st = power_attention(q[:, a:b], k[:, a:b], v[:, a:b], lg[:, a:b], p=p, norm=norm,
                                chunk_size=512, initial_state=st, return_state=True)
        ys.append(y)
    assert rel_err(torch.cat(ys, 1), whole) < 1e-4
