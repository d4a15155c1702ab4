"""GPU tests of the Triton power-attention kernels vs the float64 reference (run on a CUDA device).

Error measure: relative Frobenius error ||x - x_ref|| / ||x_ref|| of the output and of every gradient,
the reference evaluated in float64 on the same (rounded) inputs.
"""
import dataclasses
import itertools

import pytest
import torch

from longctx.kernels import power_attention, power_attention_step
from longctx.kernels.power.reference import PowerState, power_attention_reference, \
    symmetrize_diagonal_blocks
from longctx.kernels.power.autograd import chunked_form

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

TOL = {torch.bfloat16: 1e-2, torch.float16: 5e-3, torch.float32: 1e-4}
PNORM = [(1, False), (2, True), (2, False), (3, False), (4, True), (4, False)]
CASES = [(p, norm, d, dt, (i % 2 == 0))
         for i, ((p, norm), d, dt) in enumerate(itertools.product(
             PNORM, (32, 64, 128), (torch.bfloat16, torch.float16, torch.float32)))]


FP32_TINY = torch.finfo(torch.float32).tiny  # smallest normal fp32: reference values below it are 0 in fp32


def rel_err(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def assert_matches_float64_reference(y, leaves, *, p, norm, gated, dtype):
    """y (from q, k, v[, log_g] = leaves) and its gradients against the quadratic float64 reference (the same
    function, no D-sized features in memory): output rel err < TOL[dtype], gradients < 2 * TOL[dtype]."""
    assert y.dtype == dtype and torch.isfinite(y).all()
    do = torch.randn(y.shape, device=y.device, generator=torch.Generator(device=y.device).manual_seed(1)).to(y.dtype)
    grads = torch.autograd.grad(y, leaves, do)
    ref_leaves = [x.detach().double().requires_grad_() for x in leaves]
    qr, kr, vr = ref_leaves[:3]
    y_ref = power_attention_reference(qr, kr, vr, ref_leaves[3] if gated else None, p=p, norm=norm)
    grads_ref = torch.autograd.grad(y_ref, ref_leaves, do.double())
    tol = TOL[dtype]
    assert rel_err(y, y_ref) < tol
    for name, g_, gr in zip("q k v log_g".split(), grads, grads_ref):
        assert rel_err(g_, gr) < 2 * tol, name


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
    assert_matches_float64_reference(y, leaves, p=p, norm=norm, gated=gated, dtype=dtype)


@pytest.mark.parametrize("tiles", [{"dkdv": (32, 64, 4, 3), "dq": (128, 64, 8, 2)},
                                   {"dkdv": (64, 128, 8, 2), "dq": (128, 32, 4, 2)}],
                         ids=["dkdv32x64-dq128x64", "dkdv64x128-dq128x32"])
@pytest.mark.parametrize("d", [64, 128])
def test_attention_form_split_backward_tiles(tiles, d):
    """The dk/dv and dq kernels with tiles of their own (the sweep's candidates; BN > BM takes dk/dv's fast path
    across BN / BM diagonal query blocks) against the float64 reference, bf16, gated, GQA."""
    from longctx.kernels.power import config
    from longctx.kernels.power.autograd import attention_form
    q, k, v, lg = make(2, 777, 4, 2, d, torch.bfloat16, True)
    leaves = [x.requires_grad_() for x in (q, k, v, lg)]
    with config.attention.override(block_override=dict(tiles)):
        y = attention_form(q, k, v, lg, p=2, scale=d ** -0.5, norm=True)
    assert_matches_float64_reference(y, leaves, p=2, norm=True, gated=True, dtype=torch.bfloat16)


@pytest.mark.parametrize("t,seg", [(65536, None), (65536 + 100, 1024), (4096, 1000)])
def test_gate_cumsum_matches_float64(t, seg):
    """The Triton gate scan (whole sequence and chunk-local, ragged last segment) and its backward vs float64 torch:
    G's error stays at fp32 rounding of G itself (~1e-7 relative), also after 64k steps."""
    from _gate_ref import segment_cumsum_f64
    from longctx.kernels.power.gates import gate_cumsum
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.nn.functional.logsigmoid(torch.randn(2, t, 12, device="cuda", generator=g) + 3).requires_grad_()
    dy = torch.randn(2, t, 12, device="cuda", generator=g)
    y = gate_cumsum(x, seg)
    (dx,) = torch.autograd.grad(y, x, dy)
    x64 = x.detach().double().requires_grad_()
    y_ref = segment_cumsum_f64(x64, seg)
    (dx_ref,) = torch.autograd.grad(y_ref, x64, dy.double())
    assert y.dtype == torch.float32 and rel_err(y, y_ref) < 1e-6 and rel_err(dx, dx_ref) < 1e-6


@pytest.mark.parametrize("d", [32, 64])
def test_bf16_tiny_first_score_gradients(d):
    """A first query nearly orthogonal to the first key (tiny score, one key: y_0 = v_0, dq_0 = 0 exactly). The
    forward once normalized by fp32 sums of weights that the PV matmul saw rounded to bf16, so Delta = dy . y
    disagreed with the backward's weights by ~2^-9 and dq_0 got a spurious ~2^-9 |dy||v| / s: dq/dk errors up
    to 2e-2 for some upstream gradients. Now the normalizer sums the rounded weights: errors stay < 1e-2."""
    q, k, v, _ = make(2, 777, 4, 2, d, torch.bfloat16, False)
    k0, q0 = k[0, 0, 0].double(), q[0, 0, 0].double()
    q[0, 0, 0] = (q0 - 0.999 * (q0 @ k0) / (k0 @ k0) * k0).to(torch.bfloat16)
    leaves = [x.requires_grad_() for x in (q, k, v)]
    y = power_attention(q, k, v, p=2)
    ref = [x.detach().double().requires_grad_() for x in leaves]
    y_ref = power_attention_reference(*ref, p=2)
    for draw in range(6):
        do = torch.randn(y.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(draw))
        grads = torch.autograd.grad(y, leaves, do.to(y.dtype), retain_graph=True)
        grads_ref = torch.autograd.grad(y_ref, ref, do.to(y.dtype).double(), retain_graph=True)
        for name, g_, gr in zip("qkv", grads, grads_ref):
            assert rel_err(g_, gr) < 1e-2, (draw, name, rel_err(g_, gr))


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


# ----------------------------------------------------------------------------------------------
# chunked-form kernels (chunk.py; p=2 bf16 runs the state kernels of chunk_p2/)
# ----------------------------------------------------------------------------------------------

# p=4 d=128 has D = 13.4M state features (7 GB per state): not a chunked-form shape
CHUNKED_CASES = [(p, norm, d, dt, (i % 2 == 0))
                 for i, ((p, norm), d, dt) in enumerate(itertools.product(
                     PNORM, (32, 64, 128), (torch.bfloat16, torch.float16, torch.float32)))
                 if not (p == 4 and d == 128)]


@pytest.mark.parametrize("p,norm,d,dtype,gated", CHUNKED_CASES,
                         ids=[f"chunked-p{p}-{'norm' if n else 'raw'}-d{d}-{str(dt)[6:]}-{'gated' if g else 'nogate'}"
                              for p, n, d, dt, g in CHUNKED_CASES])
def test_chunked_kernel_matches_float64_reference(p, norm, d, dtype, gated):
    t, chunk = (333, 64) if p >= 3 else (777, 128)          # odd t: the last chunk is padded
    q, k, v, lg = make(1, t, 4, 2, d, dtype, gated)
    leaves = [x.requires_grad_() for x in (q, k, v) + ((lg,) if gated else ())]
    y = chunked_form(q, k, v, lg, p=p, scale=d ** -0.5, chunk_size=chunk, norm=norm)
    assert_matches_float64_reference(y, leaves, p=p, norm=norm, gated=gated, dtype=dtype)


@pytest.mark.parametrize("p,norm", [(2, True), (1, False)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_chunked_kernel_state_in_out_and_grads(p, norm, dtype):
    """Incoming and outgoing state, gradients w.r.t. the state too, vs the float64 chunked reference."""
    q, k, v, lg = make(2, 700, 4, 2, 64, dtype, True, seed=1)
    _, st = power_attention_reference(*make(2, 300, 4, 2, 64, torch.float32, True, seed=2), p=p, norm=norm,
                                      chunk_size=128, return_state=True)
    leaves = [x.requires_grad_() for x in (q, k, v, lg, st.s.clone(), st.z.clone())]
    y, st_out = chunked_form(*leaves[:4], p=p, scale=0.125, chunk_size=256, norm=norm,
                             initial_state=leaves[4:], return_state=True)
    seeds = [torch.randn_like(x) for x in (y, st_out.s, st_out.z)]
    grads = torch.autograd.grad([y, st_out.s, st_out.z], leaves, seeds)
    ref = [x.detach().double().requires_grad_() for x in leaves]
    y_ref, st_ref = power_attention_reference(*ref[:4], p=p, scale=0.125, norm=norm, chunk_size=256,
                                              initial_state=PowerState(*ref[4:]), return_state=True)
    grads_ref = torch.autograd.grad([y_ref, st_ref.s, st_ref.z], ref, [s.double() for s in seeds])
    tol = TOL[dtype]
    for name, a, b in zip(["y", "s", "z"], (y, st_out.s, st_out.z), (y_ref, st_ref.s, st_ref.z)):
        assert rel_err(a, b) < tol, name
    for name, g_, gr in zip("q k v log_g s0 z0".split(), grads, grads_ref):
        if gr.abs().max() < FP32_TINY:
            # e.g. dz0 with norm=False: z0 only reaches the returned z, through the whole sequence's decay
            # (~e^-175 here), far below fp32's range: an fp32 kernel must give (and gives) exactly 0.
            assert g_.abs().max() < FP32_TINY, name
            continue
        assert rel_err(g_, gr) < 2 * tol, name


@pytest.mark.parametrize("draw", range(4))
def test_chunked_64k_bf16_gated_large_norm_is_finite(draw):
    q, k, v, lg = make(1, 65536, 2, 1, 64, torch.bfloat16, True, seed=draw, qk_scale=8.0 * (draw + 1))
    lg = (lg * (1 + 20 * draw)).requires_grad_()
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    y = chunked_form(q, k, v, lg, p=2, scale=0.125, chunk_size=1024, norm=True)
    y.backward(torch.randn_like(y))
    for x in (y, q.grad, k.grad, v.grad, lg.grad):
        assert torch.isfinite(x).all()


@pytest.mark.parametrize("p,norm,dtype", [(2, True, torch.float32), (1, False, torch.float32),
                                          (2, True, torch.bfloat16)])
def test_chunked_pieces_equal_one_call(p, norm, dtype):
    """Through the public API (default routing): pieces with state (chunked kernels) == one call (attention
    form), and decoding steps."""
    q, k, v, lg = make(1, 3000, 4, 2, 64, dtype, True)
    whole = power_attention(q, k, v, lg, p=p, norm=norm, chunk_size=None)      # t < CHUNKED_MIN_T: attention
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    ys, st = [], None
    for a, b in ((0, 1024), (1024, 1025), (1025, 3000)):
        y, st = power_attention(q[:, a:b], k[:, a:b], v[:, a:b], lg[:, a:b], p=p, norm=norm,
                                chunk_size=512, initial_state=st, return_state=True)
        ys.append(y)
    assert rel_err(torch.cat(ys, 1), whole) < tol
    _, st = power_attention(q[:, :5], k[:, :5], v[:, :5], lg[:, :5], p=p, norm=norm, return_state=True)
    for i in (5, 6):                                                            # decoding steps
        y, st = power_attention_step(q[:, i:i + 1], k[:, i:i + 1], v[:, i:i + 1], st, lg[:, i:i + 1], p=p,
                                     norm=norm)
        assert rel_err(y, whole[:, i:i + 1]) < tol


def test_bf16_decoding_steps_carry_an_fp32_state():
    """256 bf16 decoding steps through the public step API (each a one-token chunked call with a state in and out):
    the state they hand on stays within 5e-3 of the float64 reference's on the same inputs. A state rounded to bf16
    at every call (the p=2 family's per-chunk states) drifts as a random walk: 1.7e-2 here (the float32 reference
    stepped with its state rounded to bf16 at each call, on CPU); the plan gives short stateful calls the generic
    family's fp32 states."""
    q, k, v, lg = make(2, 261, 4, 2, 64, torch.bfloat16, True)
    lg = lg / 100                                                   # a slow gate: the state remembers most tokens
    _, st = power_attention(q[:, :5], k[:, :5], v[:, :5], lg[:, :5], p=2, return_state=True)
    for i in range(5, 261):
        y, st = power_attention_step(q[:, i:i + 1], k[:, i:i + 1], v[:, i:i + 1], st, lg[:, i:i + 1], p=2)
    whole, ref = power_attention_reference(q.double(), k.double(), v.double(), lg.double(), p=2, chunk_size=261,
                                           return_state=True)
    assert st.s.dtype == torch.float32
    assert rel_err(st.s, ref.s) < 5e-3 and rel_err(st.z, ref.z) < 5e-3, (rel_err(st.s, ref.s), rel_err(st.z, ref.z))
    assert rel_err(y, whole[:, -1:]) < 1e-2


@pytest.mark.parametrize("threshold", ["chunked_min_t", "chunked_min_t_aligned"])
def test_default_routing_long_bf16_p2_is_chunked_and_matches_attention_form(monkeypatch, threshold):
    """t >= chunked_min_t (or chunked_min_t_aligned, whole chunks), bf16, p=2: chunk_size=None takes the chunked form;
    it agrees with the attention form."""
    from longctx.kernels.power import config, plan
    t = getattr(config.dispatch.current(), threshold)
    assert plan.cuda_chunk_size(t, 2, 64, torch.bfloat16) == plan.default_chunk(2, 64, torch.bfloat16)
    q, k, v, lg = make(1, t, 2, 2, 64, torch.bfloat16, True)
    y = power_attention(q, k, v, lg, p=2)
    monkeypatch.setenv(plan.IMPL_ENV, "attention")
    y_attn = power_attention(q, k, v, lg, p=2)
    assert rel_err(y, y_attn) < 1e-2


# mode family -> (config fields of the first run, of the second): the two paths a mode compares (chunk_p2 config)
STATE_PATHS = {
    "sym2": None,                                               # the generic kernels against the p=2 ones
    "rows": (dict(grouped_qbwd_min_d=0), dict(grouped_qbwd_min_d=1024)),   # grouped query backward against row-scaled
    "atomic": (dict(atomic_rmw=False), {}),                     # dq / dk by barrier + read-modify-write
    "plain": (dict(qfwd_pipe=0, kdv_pipe=0), {}),               # the Triton row kernels without slice prefetch
    "streams": (dict(concurrent_bwd=False), {}),                # 1 vs 2 streams (retain_graph: not in place)
    "normahead": (dict(norm_sums_rows=1, norm_scan_ahead=0), {}),   # a program a chunk, no loads ahead
    "levels": (dict(window_min=0), dict(window_min=16)),      # two windows against halving to 16 (forward-type)
}


@pytest.mark.parametrize("mode", ["sym2-fp32", "sym2-bf16", "sym2-bf16-d32", "sym2-bf16-d128", "rows-fp32",
                                  "rows-bf16", "rows-bf16-d32", "atomic-fp32", "atomic-bf16", "atomic-bf16-d32",
                                  "atomic-bf16-d128", "plain-fp32", "streams-bf16", "streams-bf16-d32",
                                  "normahead-bf16", "levels-bf16"])
def test_chunked_state_paths_agree(mode):
    """Two implementations of the chunked form's state term agree (STATE_PATHS: the chunk_p2 config of each run; the
    p=2 kernels forced for fp32): the generic expand-MMA kernels against the p=2 ones (sym2-*: the Gluon kernels for
    bf16 on Hopper, the Triton ones for fp32), and each runtime switch or tunable of the p=2 kernels against its
    alternative. Many chunks, state in and out, output, state and all gradients."""
    from longctx.kernels.power.chunk_p2 import config as p2_config
    dtype = torch.bfloat16 if "bf16" in mode else torch.float32
    d = int(mode.split("-d")[1]) if "-d" in mode else 64
    family = mode.split("-")[0]
    force = dict(force=dtype == torch.float32)
    runs = [dict(enabled=False), force] if family == "sym2" else [force | c for c in STATE_PATHS[family]]
    q, k, v, lg = make(2, 4000, 4, 2, d, dtype, True, seed=3)
    _, st = power_attention_reference(*make(2, 300, 4, 2, d, torch.float32, True, seed=4), p=2, norm=True,
                                      chunk_size=128, return_state=True)
    leaves = [x.requires_grad_() for x in (q, k, v, lg, st.s.clone(), st.z.clone())]
    res = []
    for changes in runs:
        with p2_config.override(**changes):
            y, st_out = chunked_form(*leaves[:4], p=2, scale=0.125, chunk_size=128, norm=True,
                                     initial_state=leaves[4:], return_state=True)
            outs = [y, st_out.s, st_out.z]
            torch.manual_seed(0)
            seeds = [torch.randn_like(x) for x in outs]
            res.append([x.detach() for x in outs]
                       + list(torch.autograd.grad(outs, leaves, seeds, retain_graph=family == "streams")))
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    for name, a, b in zip("y s z dq dk dv dlog_g ds0 dz0".split(), *res):
        assert torch.isfinite(a).all(), name
        assert rel_err(a, b) < tol, name


@pytest.mark.parametrize("d", [32, 64])
@pytest.mark.parametrize("chunk,norm,gated", [(128, True, True), (128, False, False), (40, True, True)])
def test_gluon_backward_over_the_symmetric_completion(d, chunk, norm, gated):
    """The Gluon query backward and key dk (gluon_rows._sym_pass) against the float64 reference: chunk 128 (dU from
    the Gluon scan, carrying the key multiplicities) and 40 (not a multiple of the Gluon outer products' 16-row steps:
    Triton's outer products, dU without them, the uniform factor)."""
    from longctx.kernels.power.chunk_p2 import kernels as p2_kernels
    q, k, v, lg = make(1, 777, 4, 2, d, torch.bfloat16, gated)
    assert p2_kernels.gluon_rows_apply(q, d) and p2_kernels.gluon_outer_applies(q, d, chunk) == (chunk == 128)
    leaves = [x.requires_grad_() for x in (q, k, v) + ((lg,) if gated else ())]
    y = chunked_form(q, k, v, lg, p=2, scale=d ** -0.5, chunk_size=chunk, norm=norm)
    assert_matches_float64_reference(y, leaves, p=2, norm=norm, gated=gated, dtype=torch.bfloat16)


@pytest.mark.parametrize("d", [32, 64])
def test_chunked_state_with_antisymmetric_blocks_bf16(d):
    """An incoming state with antisymmetric diagonal blocks and a returned state's gradient with them (the p=2 Gluon
    backward reads those blocks as symmetric; chunked_form takes the rest around it), weak gates so that the part
    taken around still counts at the end: output, returned state and every gradient against the float64 reference.
    The incoming state is one the keys of an earlier stretch wrote plus antisymmetric noise in its diagonal blocks
    (which no output sees): its normalizer stays positive, as every reachable one (a random one crosses zero, and
    1 / Den with it)."""
    q, k, v, lg = make(1, 700, 4, 2, d, torch.bfloat16, True, seed=5)
    lg = lg * 0.01
    _, st = power_attention_reference(*make(1, 300, 4, 2, d, torch.float32, True, seed=4), p=2, norm=True,
                                      chunk_size=128, return_state=True)
    g = torch.Generator(device="cuda").manual_seed(6)
    noise = torch.randn(st.s.shape[:-1] + (st.s.shape[-1] + 1,), device="cuda", generator=g)
    noise = noise - symmetrize_diagonal_blocks(noise, d)          # antisymmetric within diagonal blocks, 0 elsewhere
    assert noise.abs().amax() > 0.1
    s0 = st.s + noise[..., :-1] * st.s.abs().mean()
    z0 = st.z + noise[..., -1] * st.z.abs().mean()
    leaves = [x.requires_grad_() for x in (q, k, v, lg, s0, z0)]
    y, st = chunked_form(*leaves[:4], p=2, scale=0.125, chunk_size=128, norm=True, initial_state=leaves[4:],
                         return_state=True)
    seeds = [torch.randn(x.shape, device="cuda", generator=g) for x in (y, st.s, st.z)]
    grads = torch.autograd.grad([y, st.s, st.z], leaves, seeds)
    ref = [x.detach().double().requires_grad_() for x in leaves]
    y_ref, st_ref = power_attention_reference(*ref[:4], p=2, scale=0.125, norm=True, chunk_size=128,
                                              initial_state=PowerState(*ref[4:]), return_state=True)
    grads_ref = torch.autograd.grad([y_ref, st_ref.s, st_ref.z], ref, [x.double() for x in seeds])
    for name, a, b in zip(["y", "s", "z"], (y, st.s, st.z), (y_ref, st_ref.s, st_ref.z)):
        assert rel_err(a, b) < TOL[torch.bfloat16], name
    for name, g_, gr in zip("q k v log_g s0 z0".split(), grads, grads_ref):
        assert rel_err(g_, gr) < 2 * TOL[torch.bfloat16], name


def test_chunked_backward_twice_with_retain_graph():
    """retain_graph=True keeps the forward's states intact (the backward writes its state gradients over them only
    when the graph is freed after it): a second backward over the same graph gives the same gradients, and a third
    without retain_graph (in place) too."""
    q, k, v, lg = (x.requires_grad_() for x in make(1, 4096, 4, 2, 64, torch.bfloat16, True, seed=6))
    y = chunked_form(q, k, v, lg, p=2, scale=0.125, chunk_size=512, norm=True)
    do = torch.randn_like(y)
    first = torch.autograd.grad(y, (q, k, v, lg), do, retain_graph=True)
    second = torch.autograd.grad(y, (q, k, v, lg), do, retain_graph=True)
    third = torch.autograd.grad(y, (q, k, v, lg), do)
    for name, a, b, c in zip(("dq", "dk", "dv", "dlog_g"), first, second, third):
        assert torch.isfinite(a).all(), name
        assert rel_err(b, a) < 1e-6 and rel_err(c, a) < 1e-6, name


def test_chunked_backward_bitwise_reproducible_in_deterministic_mode():
    """Under torch.use_deterministic_algorithms the p=2 backward adds dq / dk by barrier + read-modify-write (not
    atomics): two backward passes give bitwise equal gradients."""
    from longctx.kernels.power.chunk_p2 import kernels as p2_kernels
    q, k, v, lg = (x.requires_grad_() for x in make(2, 4000, 4, 2, 64, torch.bfloat16, True, seed=5))
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        assert not p2_kernels.atomic_updates()
        grads = []
        for _ in range(2):
            y = chunked_form(q, k, v, lg, p=2, scale=0.125, chunk_size=1024, norm=True)
            grads.append(torch.autograd.grad(y, (q, k, v, lg), torch.ones_like(y)))
    finally:
        torch.use_deterministic_algorithms(before)
    for name, a, b in zip(("dq", "dk", "dv", "dlog_g"), *grads):
        assert torch.equal(a, b), name


def test_attention_backward_bitwise_reproducible_in_deterministic_mode():
    """Under torch.use_deterministic_algorithms the attention form's backward runs its two kernels (no dq by atomics),
    also where a call of the same shape outside that mode recorded the one-kernel backward's C++ plan first: two
    backward passes give bitwise equal gradients."""
    from longctx.kernels.power import parallel
    from longctx.kernels.power.autograd import attention_form
    q, k, v, lg = (x.requires_grad_() for x in make(2, 1000, 4, 2, 64, torch.bfloat16, True, seed=6))

    def grads():
        y = attention_form(q, k, v, lg, p=2, scale=0.125, norm=True)
        return torch.autograd.grad(y, (q, k, v, lg), torch.ones_like(y))
    grads()
    grads()                        # outside the mode: the one-kernel backward, its plan recorded for the C++ node
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        assert not parallel.fused_backward()
        first, second = grads(), grads()
    finally:
        torch.use_deterministic_algorithms(before)
    for name, a, b in zip(("dq", "dk", "dv", "dlog_g"), first, second):
        assert torch.equal(a, b), name


TMA_CASES = [(2, True, 64, torch.bfloat16, True), (2, False, 32, torch.float16, False),
             (3, False, 128, torch.float32, True), (4, True, 64, torch.bfloat16, False),
             (1, False, 128, torch.bfloat16, True)]


@pytest.mark.parametrize("p,norm,d,dtype,gated", TMA_CASES,
                         ids=[f"p{p}-{'norm' if n else 'raw'}-d{d}-{str(dt)[6:]}-{'gated' if g else 'nogate'}"
                              for p, n, d, dt, g in TMA_CASES])
def test_one_kernel_backward_dq_by_bulk_reductions(p, norm, d, dtype, gated):
    """The one-kernel backward with dq added by TMA bulk tensor reductions (tma_dq; rows past t clipped by the
    descriptor, GQA, t not a whole number of tiles) against the float64 reference, and its dq within fp32 rounding of
    the per-element atomics' dq."""
    from longctx.kernels.power import config, parallel
    from longctx.kernels.power.autograd import attention_form
    if not parallel.has_tma(torch.cuda.current_device()):
        pytest.skip("needs TMA (sm_90+)")
    q, k, v, lg = make(2, 777, 4, 2, d, dtype, gated, seed=5)
    leaves = [x.requires_grad_() for x in (q, k, v) + ((lg,) if gated else ())]
    dq = {}
    for tma in (True, False):
        with config.attention.override(fused_backward=True, tma_dq=tma):
            assert parallel.tma_dq(q.device) == tma
            y = attention_form(q, k, v, lg, p=p, scale=d ** -0.5, norm=norm)
            # before the reference check, whose backward frees the graph
            dq[tma] = torch.autograd.grad(y, q, torch.ones_like(y), retain_graph=tma)[0].float()
            if tma:
                assert_matches_float64_reference(y, leaves, p=p, norm=norm, gated=gated, dtype=dtype)
    torch.testing.assert_close(dq[True], dq[False], rtol=2 * torch.finfo(dtype).eps,
                               atol=1e-4 * dq[False].abs().max().item())


NATIVE_CASES = [  # p, norm, d, dtype, gated, hq, hk, t
    (2, True, 64, torch.bfloat16, True, 12, 12, 1024), (2, True, 64, torch.bfloat16, False, 4, 2, 1000),
    (1, False, 32, torch.float16, True, 4, 4, 333), (3, False, 128, torch.float32, True, 2, 1, 256),
    (4, True, 64, torch.bfloat16, True, 6, 3, 77), (2, False, 128, torch.bfloat16, False, 2, 2, 2048)]


@pytest.mark.parametrize("p,norm,d,dtype,gated,hq,hk,t", NATIVE_CASES,
                         ids=[f"p{c[0]}-{'norm' if c[1] else 'num'}-d{c[2]}-{str(c[3])[6:]}-{'gate' if c[4] else 'nogate'}"
                              f"-h{c[5]}x{c[6]}-t{c[7]}" for c in NATIVE_CASES])
@pytest.mark.parametrize("stream", ["default", "side"])
@pytest.mark.parametrize("fused", [True, "tma", False], ids=["fused_backward", "fused_backward_tma_dq",
                                                             "two_kernel_backward"])
def test_native_node_matches_python_node(p, norm, d, dtype, gated, hq, hk, t, stream, fused, monkeypatch):
    """The attention form's C++ node (native/) launches the kernels the Python node compiled: the same outputs
    and gradients, bit for bit, on the current stream (also a side stream), with and without gradients. The
    one-kernel backward adds dq by fp32 atomics, whose order varies from run to run: its dq and dlog_g agree entry by
    entry within two units in the last place of their dtype (plus 1e-4 of the largest entry, for entries whose fp32
    sums cancel to near zero), y, dk and dv bit for bit."""
    from longctx.kernels.power import config
    from longctx.kernels.power.autograd import attention_form
    from longctx.kernels.power.native import launcher as native
    monkeypatch.setattr(config.attention, "_current", dataclasses.replace(
        config.attention.current(), fused_backward=bool(fused), tma_dq=fused == "tma"))
    assert native.wait(), native.status()
    # a registry of this test's own: a plan another test recorded for the same specialization in this process
    # (pytest -n puts tests in workers in varying order) would otherwise serve the first no-grad call
    monkeypatch.setattr(native, "_plans", {})
    monkeypatch.setattr(native, "_forward_plans", {})
    q, k, v, lg = make(2, t, hq, hk, d, dtype, gated, seed=t)
    leaves = [x.requires_grad_() for x in (q, k, v, lg) if x is not None]
    do = torch.randn(2, t, hq, d, device="cuda").to(dtype)
    scale = d ** -0.5

    def run(grad=True):
        s = torch.cuda.Stream() if stream == "side" else torch.cuda.current_stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            with torch.no_grad():
                out = [attention_form(q, k, v, lg, p=p, scale=scale, norm=norm)]
            if grad:
                y = attention_form(q, k, v, lg, p=p, scale=scale, norm=norm)
                out += [y, *torch.autograd.grad(y, leaves, do)]
        torch.cuda.synchronize()
        return out

    monkeypatch.setenv(native.ENV, "0")
    python = run()
    monkeypatch.setenv(native.ENV, "1")
    key = native.plan_key(q, k, lg, p, norm)
    run(grad=False)                        # records the forward-only plan (Python node)
    assert native._forward_plans.get(key, -1) >= 0
    forward_only = run()                   # its no-grad call on the forward-only plan; records the full plan
    assert native._plans.get(key, -1) >= 0
    cpp = run()                            # everything on the C++ node
    names = ["y (no grad)", "y", "dq", "dk", "dv", "dlog_g"]
    for label, native_run in (("forward-only plan", forward_only[:1]), ("full plan", cpp)):
        for name, a, b in zip(names, python, native_run):
            assert a.dtype == b.dtype and a.shape == b.shape, (label, name)
            diff = (a.float() - b.float()).abs().max().item()
            if fused and name in ("dq", "dlog_g"):    # fp32 atomic adds in varying order
                torch.testing.assert_close(b.float(), a.float(), rtol=2 * torch.finfo(a.dtype).eps,
                                           atol=1e-4 * a.float().abs().max().item(),
                                           msg=lambda m: f"{label}, {name}: {m}")
            else:
                assert torch.equal(a, b), f"{label}, {name}: max |diff| {diff}"


def test_a_full_plan_serves_calls_without_gradients(monkeypatch):
    """A specialization first called with gradients gets a full plan and no forward-only one; a later call without
    gradients runs on that full plan (no new recording) and gives the Python node's output bit for bit."""
    from longctx.kernels.power.autograd import attention_form
    from longctx.kernels.power.native import launcher as native
    assert native.wait(), native.status()
    monkeypatch.setattr(native, "_plans", {})
    monkeypatch.setattr(native, "_forward_plans", {})
    q, k, v, _ = make(2, 1008, 4, 2, 64, torch.bfloat16, False, seed=11)
    leaves = [x.requires_grad_() for x in (q, k, v)]
    monkeypatch.setenv(native.ENV, "1")
    y = attention_form(q, k, v, None, p=2, scale=0.125, norm=True)
    torch.autograd.grad(y, leaves, torch.ones_like(y))      # records the full plan
    key = native.plan_key(q, k, None, 2, True)
    assert native._plans.get(key, -1) >= 0
    with torch.no_grad():
        cpp = attention_form(q, k, v, None, p=2, scale=0.125, norm=True)
    assert key not in native._forward_plans
    monkeypatch.setenv(native.ENV, "0")
    with torch.no_grad():
        python = attention_form(q, k, v, None, p=2, scale=0.125, norm=True)
    assert torch.equal(cpp, python), f"max |diff| {(cpp.float() - python.float()).abs().max().item()}"
