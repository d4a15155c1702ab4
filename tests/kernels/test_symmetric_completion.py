"""The p=2 backward over the state's symmetric completion (gluon_rows._sym_pass), as a float64
identity on the reference's tiled layout: the slice rows its copies read (the kernel's own _sym_tile_rows, run on
torch tensors) are the features {i, j}, and the sum over slices i of (x_i a) M~_i^T with its column factors is the
gradient of phi(x) . X, X = a S^T, whose half dotted with x is X . phi(x) (Euler: the gate term). The kernel itself
runs on GPUs only (tests/kernels/test_power_gpu.py)."""
from types import SimpleNamespace

import pytest
import torch

from longctx.kernels.power.reference import PowerState, expand, state_dim, symmetrize_diagonal_blocks

TW = 8      # chunk_p2.config.TILE2


def completion_rows(i: int, d: int) -> list[int]:
    """Layout row of the feature {i, j} for every column j, from the kernel's own gluon_rows._sym_tile_rows (its
    Gluon body run on torch tensors): slice i of first tile ti reads row base + (i % TW) stride."""
    gluon_rows = pytest.importorskip("longctx.kernels.power.chunk_p2.gluon_rows")
    fn = gluon_rows._sym_tile_rows.fn
    names = fn.__globals__
    saved = {k: names[k] for k in ("gl", "_diag")}
    names["gl"] = SimpleNamespace(minimum=torch.minimum, maximum=torch.maximum, where=torch.where)
    names["_diag"] = gluon_rows._diag.fn
    try:
        base, stride = fn(torch.arange(d), torch.tensor(i // TW), TW, d // TW)
    finally:
        names.update(saved)
    return (base + (i % TW) * stride).tolist()


def completion_grad(x, a, S, uniform):
    """sum_i (x_i a) M~_i^T, M~_i = S[completion_rows(i)], each slice's columns times 2 on its own tile and 1
    elsewhere (uniform: 2 everywhere), in _sym_pass's schedule: the accumulator's columns rescaled at each first tile
    ti's start (tile ti's halved, tile ti - 1's doubled) and the last tile's doubled after the loop (uniform: all
    doubled after it)."""
    d = x.shape[-1]
    col_tile = torch.arange(d) // TW
    acc = torch.zeros_like(x)
    for ti in range(d // TW):
        if not uniform:
            acc = acc * torch.where(col_tile == ti - 1, 2.0, torch.where(col_tile == ti, 0.5, 1.0)).to(x.dtype)
        for i in range(ti * TW, (ti + 1) * TW):
            acc = acc + (x[:, i:i + 1] * a) @ S[completion_rows(i, d)].T
    return acc * 2.0 if uniform else acc * torch.where(col_tile == d // TW - 1, 2.0, 1.0).to(x.dtype)


@pytest.mark.parametrize("d", [16, 32, 64])
def test_completion_rows_are_the_features(d):
    """Row completion_rows(i)[j] of the tiled power of x holds x_i x_j, for every i and j."""
    x = torch.randn(d, dtype=torch.float64)
    phi = expand(x, 2)
    assert phi.shape[-1] == state_dim(2, d)
    for i in range(d):
        torch.testing.assert_close(phi[completion_rows(i, d)], x[i] * x, rtol=0, atol=0)


@pytest.mark.parametrize("d", [16, 32, 64])
@pytest.mark.parametrize("uniform", [False, True])
def test_completion_sum_is_the_gradient_and_euler_gives_the_gate_term(d, uniform):
    """The states as the kernels hold them: S = w phi(k)^T v with the key multiplicities w (queries' S, and dU with
    them), or dU without them, whose gradient carries w on x's side (uniform). Against autograd of X . phi(x)."""
    g = torch.Generator().manual_seed(d)
    n, e = 5, 24
    k, v = torch.randn(7, d, generator=g, dtype=torch.float64), torch.randn(7, e, generator=g, dtype=torch.float64)
    S = expand(k, 2, weighted=not uniform).T @ v
    x = torch.randn(n, d, generator=g, dtype=torch.float64, requires_grad=True)
    a = torch.randn(n, e, generator=g, dtype=torch.float64)
    gate = (expand(x, 2, weighted=uniform) * (a @ S.T)).sum(-1)           # X . phi(x) per row
    (grad,) = torch.autograd.grad(gate.sum(), x)
    acc = completion_grad(x.detach(), a, S, uniform)
    torch.testing.assert_close(acc, grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(0.5 * (x.detach() * acc).sum(-1), gate.detach(), rtol=1e-12, atol=1e-12)


def test_states_go_around_the_kernels_exactly(monkeypatch):
    """chunked_form on the p=2 family hands its kernels only states whose diagonal blocks are
    symmetric: an incoming state with an antisymmetric part and a returned state's gradient with one reach the
    kernels symmetrized, and the parts taken off go around them so that the output, the returned state and every
    gradient are the float64 reference's (the kernels stood in for by the reference on what they are handed)."""
    from longctx.kernels.power import autograd, plan as plan_mod
    from longctx.kernels.power.reference import power_attention_reference
    monkeypatch.setattr(plan_mod, "p2_family", lambda p, d, dtype: p == 2)
    g = torch.Generator().manual_seed(0)
    b, t, h, d, C = 1, 32, 2, 16, 16
    q, k, v = (torch.randn(b, t, h, d, generator=g, dtype=torch.float64) for _ in range(3))
    lg = -0.1 * torch.rand(b, t, h, generator=g, dtype=torch.float64)
    # incoming states as fp32 holds them (chunked_form takes them in fp32; their gradients come back rounded so)
    s0 = torch.randn(b, h, state_dim(2, d), d, generator=g).double()
    z0 = torch.rand(b, h, state_dim(2, d), generator=g).double()
    leaves = [x.clone().requires_grad_() for x in (q, k, v, lg, s0, z0)]
    seen = {}

    def kernels(q, k, v, gl, s0, z0, scale, p, norm, C, want_state, family):
        y, st = power_attention_reference(q, k, v, leaves[3], p=p, scale=scale, norm=norm, chunk_size=C,
                                          initial_state=PowerState(s0, z0), return_state=True)
        seen["s0"] = s0.detach()
        st.s.register_hook(lambda grad: seen.setdefault("dsf", grad))
        return y, st.s, st.z
    monkeypatch.setattr(autograd.ChunkedForm, "apply", kernels)
    monkeypatch.setattr(autograd.gates, "gate_cumsum", lambda lg, C: None)      # a Triton scan; the stand-in reads lg
    y, st = autograd.chunked_form(*leaves[:4], p=2, scale=0.25, chunk_size=C, norm=True,
                                  initial_state=(leaves[4], leaves[5]), return_state=True)
    ref = [x.clone().requires_grad_() for x in (q, k, v, lg, s0, z0)]
    y_ref, st_ref = power_attention_reference(*ref[:4], p=2, scale=0.25, norm=True, chunk_size=C,
                                              initial_state=PowerState(ref[4], ref[5]), return_state=True)
    for got, want in zip((y, st.s, st.z), (y_ref, st_ref.s, st_ref.z)):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-7)
    seeds = [torch.randn(x.shape, generator=g, dtype=torch.float64) for x in (y_ref, st_ref.s, st_ref.z)]
    grads = torch.autograd.grad([y, st.s, st.z], leaves, seeds)
    grads_ref = torch.autograd.grad([y_ref, st_ref.s, st_ref.z], ref, seeds)
    for name, got, want in zip("q k v log_g s0 z0".split(), grads, grads_ref):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-7, msg=name)
    for name, x in (("s0", s0), ("dsf", seeds[1])):
        assert not torch.equal(symmetrize_diagonal_blocks(x, d), x)          # each had an antisymmetric part ...
        torch.testing.assert_close(seen[name].double(), symmetrize_diagonal_blocks(x, d), rtol=1e-5, atol=1e-7)
