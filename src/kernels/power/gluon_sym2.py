"""The p=2 outer products (`triton_sym2._sym2_outer`) in Gluon: phi^T built in the tensor cores' register layout.

Why: Triton builds `_sym2_outer`'s phi^T [features, rows] = x_i x_j as a broadcast product reshaped to 2-D, a layout
it then converts to the wgmma operand layout through shared memory (8 stores, a barrier and 8 loads a step, sm_90
SASS), and the next step's expansion waits for the previous step's matmul because both use the same registers
(session 10). Here the factor tiles come in through a shared-memory ring (cp.async, prefetched NBUF - 1 steps ahead),
each thread reads exactly the factors of its own operand fragment (the slices of `operand_layout_3d`, the operand
layout of phi^T seen as [first index, second index, rows]), and the product is the wgmma's register operand with no
data movement (`convert_layout(..., assert_trivial=True)` checks that at compile time). The matmuls are issued
asynchronously with one in flight; the previous step's operand stays live until its matmul is done, so the next
expansion writes other registers and overlaps it.

Same program grid, arguments and results as `_sym2_outer` with XT_IN (the factors from the (b, h, d, t) copy): KEYS,
the update states U_n = sum_j w phi(k_j) e^(gt_n - g_j) v_j^T and their normalizer sums; else the query-side state
gradients. Gluon does not run under TRITON_INTERPRET: the GPU tests compare it with `_sym2_outer`
(`triton_sym2.OUTER_GLUON`).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, \
    warpgroup_mma_wait

# cp.async global -> shared: `async_copy_global_to_shared` in Triton 3.6 (the device's), `async_load` from 3.7 on
_cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
_barrier = getattr(gl, "thread_barrier", None) or gl.barrier        # the CTA barrier: renamed after 3.6


def operand_layout_3d(tw: int, tj: int, bk: int) -> gl.DistributedLinearLayout:
    """The wgmma A-operand register layout of phi^T [tw * tj, bk] (bf16, 4 warps: rows f = a * tj + c) as a 3-D
    layout over [a, c, rows]. Its 2-D bases (gl.to_linear_layout of DotOperandLayout(0, mma v3, k_width=2), Triton
    3.6): registers (0,1), (8,0), (0,8), then (0,16), (0,32).. up to bk, then (64,0).. up to the rows; lanes (0,2),
    (0,4), (1,0), (2,0), (4,0); warps (16,0), (32,0)."""
    fg = tw * tj

    def split(f, r):          # a 2-D basis (f, r) as (a, c, r); f is 0 or a power of two
        return [f // tj, f % tj, r]

    reg = [(0, 1), (8, 0), (0, 8)] + [(0, k) for k in (16, 32, 64, 128) if k < bk] \
        + [(m, 0) for m in (64, 128, 256) if m < fg]
    lane = [(0, 2), (0, 4), (1, 0), (2, 0), (4, 0)]
    warp = [(16, 0), (32, 0)]
    return gl.DistributedLinearLayout([split(*b) for b in reg], [split(*b) for b in lane], [split(*b) for b in warp],
                                      [], [tw, tj, bk])


@gluon.jit
def _issue_step(xi_p, xj_p, jmask, y_p, xi_s, xj_s, y_s, step, T, HX: gl.constexpr, HK: gl.constexpr,
                D: gl.constexpr, C: gl.constexpr, BK: gl.constexpr, NBUF: gl.constexpr, NSTEP: gl.constexpr):
    """cp.async of step `step`'s factor rows x^T[8 ti:8 ti+8, rows], x^T[colj, rows] and y[rows, :] into ring slot
    step % NBUF (nothing past the last step), from the step-0 addresses plus one scalar offset per tensor; one commit
    group per step either way, so the waits count steps."""
    NSTEP_C: gl.constexpr = C // BK
    if step < NSTEP:
        s = step % NBUF
        rep = step // NSTEP_C
        rr = (step % NSTEP_C) * BK
        xo = rep.to(gl.int64) * (D * T) + rr                   # next GQA head: the copy's next (D, T) plane
        yo = rep * D + rr * (HX * D)
        _cp_async(xi_s.index(s), xi_p + xo)
        _cp_async(xj_s.index(s), xj_p + xo, mask=jmask)
        _cp_async(y_s.index(s), y_p + yo)
    async_copy.commit_group()


@gluon.jit
def _delta_rows(DELTA, d_p, step, C: gl.constexpr, BK: gl.constexpr, HX: gl.constexpr, NSTEP: gl.constexpr):
    """The query side's normalizer weights -Delta of step `step`'s rows (0 past the last step), loaded a step before
    their use so the latency hides behind a step's matmul."""
    NSTEP_C: gl.constexpr = C // BK
    return -gl.load(d_p + (step // NSTEP_C) + (step % NSTEP_C) * (BK * HX), mask=step < NSTEP, other=0.0)


@gluon.jit
def gluon_outer(X, Y, DELTA, GRP, OUT, OUTZ, T, NC, DS, SLOT,
                HX: gl.constexpr, HK: gl.constexpr, D: gl.constexpr, C: gl.constexpr, TW: gl.constexpr,
                JG: gl.constexpr, BK: gl.constexpr, KEYS: gl.constexpr, NORM: gl.constexpr, NBUF: gl.constexpr,
                L3: gl.constexpr):
    """Program (group g, chunk n, b*hk) writes slot n + SLOT of OUT (b, hk, NC+1, DS, D) / OUTZ for its group's
    features, as `_sym2_outer` with XT_IN. X: the (b, HX, D, T) copy of k (KEYS) or q with each row already scaled
    by the square root of its row factor (`triton_sym2._transpose_heads` with SCALE), so phi(x) f = x'_i x'_j needs
    no per-row work here. L3: operand_layout_3d. The products are formed in bf16 (one rounding, as the fp32 product
    rounded for the matmul); the keys' normalizer sums run on the tensor cores (phi^T times a [rows, 16] tile of
    ones), the query side's (weights -Delta per row) as fp32 FMAs."""
    TJ: gl.constexpr = TW * JG
    FG: gl.constexpr = TW * TJ
    REP: gl.constexpr = HX // HK
    NSTEP: gl.constexpr = REP * (C // BK)
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    MMAZ: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 8, 16])
    A_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    AZ_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMAZ, k_width=2)
    XI_L: gl.constexpr = gl.SliceLayout(1, L3)          # [TW, BK]: x_i of this thread's fragment rows
    XJ_L: gl.constexpr = gl.SliceLayout(0, L3)          # [TJ, BK]
    RL: gl.constexpr = gl.SliceLayout(0, XI_L)          # [BK]
    CPX: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (BK // 8), BK // 8], [4, 1], [1, 0])
    CPY: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (D // 8), D // 8], [4, 1], [1, 0])
    # factor tiles: 16-byte chunks swizzled by row pairs, so a warp's 8 rows x 16 bytes hit 32 banks
    XS: gl.constexpr = gl.SwizzledSharedLayout(8, 2, 4, [1, 0])
    xi_s = gl.allocate_shared_memory(gl.bfloat16, [NBUF, TW, BK], XS)
    xj_s = gl.allocate_shared_memory(gl.bfloat16, [NBUF, TJ, BK], XS)
    y_s = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BK, D], gl.NVMMASharedLayout.get_default_for([BK, D],
                                                                                                 gl.bfloat16))
    g = gl.program_id(0)
    n = gl.program_id(1)
    pid_bh = gl.program_id(2)
    i_b = (pid_bh // HK).to(gl.int64)
    i_hk = pid_bh % HK
    ti = gl.load(GRP + 3 * g)
    tj = gl.load(GRP + 3 * g + 1)
    l0 = gl.load(GRP + 3 * g + 2)
    start = n * C
    # step-0 addresses (head i_hk * REP, rows start..start+BK); later steps add a scalar offset (_issue_step)
    xt = X + ((i_b * HX + i_hk * REP) * D) * T + start
    rx = gl.arange(0, BK, layout=gl.SliceLayout(0, CPX))
    ai = gl.arange(0, TW, layout=gl.SliceLayout(1, CPX))
    cj = tj * TW + gl.arange(0, TJ, layout=gl.SliceLayout(1, CPX))
    xi_p = xt + (ti * TW + ai)[:, None] * T + rx[None, :]
    xj_p = xt + cj[:, None] * T + rx[None, :]
    jmask = (cj < D)[:, None] & (rx < BK)[None, :]
    ry = gl.arange(0, BK, layout=gl.SliceLayout(1, CPY))
    dy = gl.arange(0, D, layout=gl.SliceLayout(0, CPY))
    y_p = Y + ((i_b * T + start + ry) * HX + i_hk * REP)[:, None] * D + dy[None, :]
    d_p = DELTA + (i_b * T + start + gl.arange(0, BK, layout=RL)) * HX + i_hk * REP

    for p in gl.static_range(NBUF - 1):
        _issue_step(xi_p, xj_p, jmask, y_p, xi_s, xj_s, y_s, p, T, HX, HK, D, C, BK, NBUF, NSTEP)
    acc = gl.zeros([FG, D], gl.float32, MMA)
    if KEYS:
        # the normalizer: phi^T times ones (every column of accz the same sum)
        ONES: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BK, 8], gl.bfloat16)
        ones_s = gl.allocate_shared_memory(gl.bfloat16, [BK, 8], ONES,
                                           gl.full([BK, 8], 1.0, gl.bfloat16, gl.BlockedLayout([1, 8], [32, 1],
                                                                                               [4, 1], [1, 0])))
        fence_async_shared()
        accz = gl.zeros([FG, 8], gl.float32, MMAZ)
    else:
        accz = gl.zeros([TW, TJ, BK], gl.float32, L3)
        dl = _delta_rows(DELTA, d_p, 0, C, BK, HX, NSTEP)
    phi_prev = gl.zeros([FG, BK], gl.bfloat16, A_L)
    lo_prev = gl.zeros([FG, BK], gl.bfloat16, AZ_L)
    for step in range(NSTEP):
        s = step % NBUF
        if not KEYS and NORM:
            dl_next = _delta_rows(DELTA, d_p, step + 1, C, BK, HX, NSTEP)
        async_copy.wait_group(NBUF - 2)
        _barrier()
        xi = xi_s.index(s).load(XI_L)
        xj = xj_s.index(s).load(XJ_L)
        xi3 = gl.expand_dims(xi, 1)
        xj3 = gl.expand_dims(xj, 0)
        phi3 = xi3 * xj3                                                               # [TW, TJ, BK] bf16
        phi = gl.convert_layout(gl.reshape(phi3, [FG, BK]), A_L, assert_trivial=True)
        acc = warpgroup_mma(phi, y_s.index(s), acc, is_async=True)
        if KEYS:
            # the normalizer sums the exact products: phi = hi + lo with lo = x_i x_j - hi (exact in bf16, one fma)
            # (the bf16 products alone lose ~2^-9 sqrt(rows) relatively where signs cancel: 9% at 1500 rows)
            lo = gl.convert_layout(gl.reshape(gl.fma(xi3, xj3, -phi3), [FG, BK]), AZ_L, assert_trivial=True)
            accz = warpgroup_mma(gl.convert_layout(phi, AZ_L, assert_trivial=True), ones_s, accz, is_async=True)
            accz = warpgroup_mma(lo, ones_s, accz, is_async=True)
            # the previous step's matmuls are done: its slot takes step + NBUF - 1, its operand registers are free
            acc, accz, phi_prev, lo_prev = warpgroup_mma_wait(num_outstanding=3, deps=(acc, accz, phi_prev, lo_prev))
            lo_prev = lo
        else:
            if NORM:      # the exact products, in fp32
                accz += (xi3.to(gl.float32) * xj3.to(gl.float32)) * gl.expand_dims(gl.expand_dims(dl, 0), 1)
                dl = dl_next
            acc, phi_prev = warpgroup_mma_wait(num_outstanding=1, deps=(acc, phi_prev))
        phi_prev = phi
        _issue_step(xi_p, xj_p, jmask, y_p, xi_s, xj_s, y_s, step + NBUF - 1, T, HX, HK, D, C, BK, NBUF, NSTEP)
    if KEYS:
        acc, accz, phi_prev, lo_prev = warpgroup_mma_wait(num_outstanding=0, deps=(acc, accz, phi_prev, lo_prev))
    else:
        acc, phi_prev = warpgroup_mma_wait(num_outstanding=0, deps=(acc, phi_prev))
    async_copy.wait_group(0)

    # the group's state rows (layout rows of the features (a, c): see triton_sym2._feature_rows); KEYS: the
    # multiplicities (1 in tile ti, 2 after it) scale the finished sums (exact: the steps' products did not carry them)
    base = (pid_bh.to(gl.int64) * (NC + 1) + n + SLOT) * DS
    offs_f = gl.arange(0, FG, layout=gl.SliceLayout(1, MMA))
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, MMA))
    c = offs_f % TJ
    lrow = (l0 + c // TW) * (TW * TW) + (offs_f // TJ) * TW + c % TW
    if KEYS:
        acc = acc * gl.expand_dims(gl.where(tj + c // TW == ti, 1.0, 2.0), 1)
    gl.store(OUT + (base + lrow)[:, None] * D + offs_d[None, :], acc.to(OUT.dtype.element_ty),
             mask=(tj * TW + c < D)[:, None])
    ZL: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    if KEYS:
        z = gl.convert_layout(gl.max(accz, axis=1), ZL)           # the 8 columns hold the same sum
    else:
        z = gl.convert_layout(gl.reshape(gl.sum(accz, axis=2), [FG]), ZL)
    fz = gl.arange(0, FG, layout=ZL)
    cz = fz % TJ
    if KEYS:
        z = z * gl.where(tj + cz // TW == ti, 1.0, 2.0)
    gl.store(OUTZ + base + (l0 + cz // TW) * (TW * TW) + (fz // TJ) * TW + cz % TW, z, mask=tj * TW + cz < D)
