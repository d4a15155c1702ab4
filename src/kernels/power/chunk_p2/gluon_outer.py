"""The p=2 outer products (`kernels._sym2_outer`) in Gluon: phi^T built in the tensor cores' register layout.

Why: Triton builds `_sym2_outer`'s phi^T [features, rows] = x_i x_j as a broadcast product reshaped to 2-D, a layout
it then converts to the wgmma operand layout through shared memory (8 stores, a barrier and 8 loads a step, sm_90
SASS), and the next step's expansion waits for the previous step's matmul because both use the same registers
(sm_90 SASS). Here the factor tiles come in through a shared-memory ring (cp.async, prefetched NBUF - 1 steps ahead),
each thread reads exactly the factors of its own operand fragment (the slices of `operand_layout_3d`, the operand
layout of phi^T seen as [first index, second index, rows]), and the product is the wgmma's register operand with no
data movement (`convert_layout(..., assert_trivial=True)` checks that at compile time). The matmuls are issued
asynchronously with one in flight; the previous step's operand stays live until its matmul is done, so the next
expansion writes other registers and overlaps it.

The results of `_sym2_outer` (the factors from the (b, h, d, t) copy) scanned over the chunks in the same pass:
KEYS, the update states U_n = sum_j w phi(k_j) e^(gt_n - g_j) v_j^T; else the query-side state gradients (their
normalizer: kernels.launch_norm_scan). Gluon does not run under TRITON_INTERPRET: the GPU tests compare it with
the generic kernels and the float64 reference.
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


@gluon.constexpr_function
def factor_swizzle(BK):
    """The factor tiles' shared layout ([rows, BK] bf16, 16-byte chunks swizzled): an ldmatrix reads 8 consecutive
    rows x 16 bytes, which hit all 32 banks once when the chunks' phase changes with every 128-byte line: per row at
    BK = 64 (rows of 128 bytes), per row pair at 32, per 4 rows at 16 (phases by row pairs at any BK gave 2-way bank
    conflicts on every ldmatrix of x_j at BK = 64)."""
    return gl.SwizzledSharedLayout(8, max(1, 64 // BK), min(8, BK // 8), [1, 0])


@gluon.jit
def _group_rows(grows, ti, tj, tjb, FG: gl.constexpr, TJ: gl.constexpr, TW: gl.constexpr, D: gl.constexpr,
                KEYS: gl.constexpr, LAYOUT: gl.constexpr):
    """The group's state rows as [FG, D] offsets in LAYOUT (the accumulator's), their mask and the keys'
    multiplicities (_group_mults)."""
    frows, fmask, mult = _group_zrows(grows, ti, tj, tjb, FG, TJ, TW, KEYS, gl.SliceLayout(1, LAYOUT))
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, LAYOUT))
    return frows[:, None] * D + offs_d[None, :], fmask[:, None], gl.expand_dims(mult, 1) if KEYS else 1.0


@gluon.jit
def _group_mults(ti, tj, tjb, FG: gl.constexpr, TJ: gl.constexpr, TW: gl.constexpr, KEYS: gl.constexpr,
                 LAYOUT: gl.constexpr):
    """Per accumulator row (LAYOUT 1-D) the keys' multiplicity (1.0 for the query side): row a TW + c is column tile
    tj for c % (TW JG) < TW, else tjb; 1 where that is the row tile ti (a diagonal block), else 2. They scale the
    finished sums (exact: the steps' products did not carry them)."""
    f = gl.arange(0, FG, layout=LAYOUT)
    return gl.where(gl.where(f % TJ >= TW, tjb, tj) == ti, 1.0, 2.0) if KEYS else 1.0


@gluon.jit
def _group_zrows(grows, ti, tj, tjb, FG: gl.constexpr, TJ: gl.constexpr, TW: gl.constexpr, KEYS: gl.constexpr,
                 LAYOUT: gl.constexpr):
    """Per accumulator row (LAYOUT 1-D) its layout row, whether it exists (the group's row of
    kernels.gluon_groups' table grows: the row or -1; loaded, not computed: the pairs of last blocks map their
    rows transposed, and the formulas' registers spilled at the cap) and the keys' multiplicity (_group_mults)."""
    e = gl.load(grows + gl.arange(0, FG, layout=LAYOUT))
    return gl.maximum(e, 0), e >= 0, _group_mults(ti, tj, tjb, FG, TJ, TW, KEYS, LAYOUT)


@gluon.jit
def _prefetch_state(SF, sf_s, slot, DS, grows, ti, tj, tjb, FG: gl.constexpr, TJ: gl.constexpr, TW: gl.constexpr,
                    D: gl.constexpr, CP: gl.constexpr):
    """cp.async of the group's rows of state slot `slot` of SF (bf16 (.., DS, D)) into sf_s [FG, D] in the copy
    layout CP (the ring's [rows, D] one), one commit group (rows outside the state: zeros)."""
    rows, fmask, _ = _group_rows(grows, ti, tj, tjb, FG, TJ, TW, D, False, CP)
    _cp_async(sf_s, SF + slot * DS * D + rows, mask=fmask & (rows >= 0))      # (rows >= 0: the mask's full shape)
    async_copy.commit_group()


@gluon.jit
def _issue_step(xi_p, xj_p, jmask, y_p, xi_s, xj_s, y_s, step, nstep_all, T, HX: gl.constexpr,
                HK: gl.constexpr, D: gl.constexpr, C: gl.constexpr, BK: gl.constexpr, NBUF: gl.constexpr,
                NSTEP: gl.constexpr, REV: gl.constexpr):
    """cp.async of step `step`'s factor rows x^T[8 ti:8 ti+8, rows], x^T[colj, rows], y[rows, :] into ring slot
    step % NBUF (nothing past the last of nstep_all), from the first chunk's
    step-0 addresses plus one scalar offset per tensor; one commit group per step either way, so the waits count
    steps. Steps run through the GQA heads of a chunk (NSTEP per chunk), then the next chunk: the one after (REV
    False) or before (REV: the reverse scan) it."""
    NSTEP_C: gl.constexpr = C // BK
    if step < nstep_all:
        s = step % NBUF
        ci = step // NSTEP
        st = step % NSTEP
        rep = st // NSTEP_C
        rr = (st % NSTEP_C) * BK + (-ci if REV else ci) * C           # rows from the first chunk's start
        xo = rep.to(gl.int64) * (D * T) + rr                  # next GQA head: the copy's next (D, T) plane
        _cp_async(xi_s.index(s), xi_p + xo)
        _cp_async(xj_s.index(s), xj_p + xo, mask=jmask)
        yo = rep.to(gl.int64) * D + rr.to(gl.int64) * (HX * D)
        _cp_async(y_s.index(s), y_p + yo)
    async_copy.commit_group()


@gluon.jit
def gluon_outer(X, Y, W, GRP, GROWS, OUT, OUTZ, T, NC, DS, SLOT,
                HX: gl.constexpr, HK: gl.constexpr, D: gl.constexpr, C: gl.constexpr, TW: gl.constexpr,
                JG: gl.constexpr, BK: gl.constexpr, KEYS: gl.constexpr, NORM: gl.constexpr, NBUF: gl.constexpr,
                L3: gl.constexpr, G=None, SF=None, ZF=None, DGT=None, GATED: gl.constexpr = False,
                DU_MULT: gl.constexpr = False):
    """Program (group g, 1, b*hk): the group's features of every chunk's sums and of the gated cumulative sum over
    chunks, in one pass (what `chunk_stages._discumsum` does after `_sym2_outer`), into OUT (b, hk, NC+1, DS, D);
    GRP / GROWS: kernels.gluon_groups' tables (its tiles, the layout rows of its accumulator rows). X: the
    (b, HX, D, T) copy of k (KEYS) or q with each row already scaled by the square root of its row factor (written
    by the intra-chunk attention kernels), so phi(x) f = x'_i x'_j needs no per-row work here. L3:
    operand_layout_3d. The products are formed in bf16 (one rounding, as the fp32 product rounded for the matmul).
    The normalizer (OUTZ, and dgt's z part) is kernels.launch_norm_scan's; W and the keys' ones tile are the
    normalizer weights' (unread here).

    The group's running state stays in the fp32 accumulators, decay_n = e^(G at chunk n's last row):
      keys: slot 0 holds S_0; chunk by chunk, S_{n+1} = decay_n S_n + U_n is written to slot n + 1;
      query side (reverse): slot NC holds dL/dS_NC; for n = NC-1..0, R_n = Q_n + decay_n R_{n+1} is written to
      slot n, and with GATED DGT[b*hk, g, n] = decay_n <S_n, R_{n+1}> over the group's rows (SF: the forward's
      states, ZF unread). DU_MULT (query side): slots 1..NC (the key side's dU) are written times the key side's
      multiplicities (1 in tile ti, 2 after it; exact), so the key kernels need not apply them; slot 0 (the initial
      state's gradient) stays plain.

    Every step waits for the previous step's matmuls before it writes its operand registers. Without that the
    previous step's matmuls may still be in flight there: the `deps` of the wait keep phi alive for LLVM only (a
    comment in the wait's inline asm), and ptxas gives the next step's factors and products the same registers
    (Triton 3.6 SASS: the loop's LDSM / HMUL2 write the registers the last HGMMA reads, after only
    `WARPGROUP.DEPBAR.LE gsb0, 0x3`). That was a normalizer race at one block per group (docs/kernels.md)."""
    TJ: gl.constexpr = TW * JG
    FG: gl.constexpr = TW * TJ
    REP: gl.constexpr = HX // HK
    NSTEP: gl.constexpr = REP * (C // BK)
    REV: gl.constexpr = not KEYS
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    A_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    XI_L: gl.constexpr = gl.SliceLayout(1, L3)          # [TW, BK]: x_i of this thread's fragment rows
    XJ_L: gl.constexpr = gl.SliceLayout(0, L3)          # [TJ, BK]
    CPX: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (BK // 8), BK // 8], [4, 1], [1, 0])
    CPY: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (D // 8), D // 8], [4, 1], [1, 0])
    CPW: gl.constexpr = gl.BlockedLayout([1, 8], [32, 1], [4, 1], [1, 0])
    XS: gl.constexpr = factor_swizzle(BK)
    WS: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BK, 8], gl.bfloat16)
    xi_s = gl.allocate_shared_memory(gl.bfloat16, [NBUF, TW, BK], XS)
    xj_s = gl.allocate_shared_memory(gl.bfloat16, [NBUF, TJ, BK], XS)
    y_s = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BK, D], gl.NVMMASharedLayout.get_default_for([BK, D],
                                                                                                 gl.bfloat16))
    w_s = gl.allocate_shared_memory(gl.bfloat16, [1, BK, 8], WS)
    # the reverse scan's dgt reads the forward's state S_n of each chunk: cp.async'd into shared memory during the
    # chunk before, so the chunk boundary does not wait on a [FG, D] global load (and each scan's decay is loaded a
    # chunk ahead)
    PREFETCH: gl.constexpr = REV and GATED
    sf_s = gl.allocate_shared_memory(gl.bfloat16, [FG if PREFETCH else 8, D],
                                     gl.SwizzledSharedLayout(8, 1, min(8, D // 8), [1, 0]))
    g = gl.program_id(0)
    pid_bh = gl.program_id(2)
    n_first = (NC - 1) if REV else 0
    nchunk = NC
    i_b = (pid_bh // HK).to(gl.int64)
    i_hk = pid_bh % HK
    ti = gl.load(GRP + 3 * g)     # the group (kernels.gluon_groups): its row tile and two column tiles
    tj = gl.load(GRP + 3 * g + 1)
    tjb = gl.load(GRP + 3 * g + 2)
    grows = GROWS + g * FG        # and the layout rows of its features
    start = n_first * C
    # step-0 addresses (head i_hk * REP, rows start..start+BK); later steps add a scalar offset (_issue_step)
    xt = X + ((i_b * HX + i_hk * REP) * D) * T + start
    rx = gl.arange(0, BK, layout=gl.SliceLayout(0, CPX))
    ai = gl.arange(0, TW, layout=gl.SliceLayout(1, CPX))
    cc = gl.arange(0, TJ, layout=gl.SliceLayout(1, CPX))
    cj = gl.where(cc >= TW, tjb, tj) * TW + cc % TW             # the x_j rows: TW of tile tj, then TW of tile tjb
    xi_p = xt + (ti * TW + ai)[:, None] * T + rx[None, :]
    xj_p = xt + cj[:, None] * T + rx[None, :]
    jmask = (cj < D)[:, None] & (rx < BK)[None, :]
    ry = gl.arange(0, BK, layout=gl.SliceLayout(1, CPY))
    dy = gl.arange(0, D, layout=gl.SliceLayout(0, CPY))
    y_p = Y + ((i_b * T + start + ry) * HX + i_hk * REP)[:, None] * D + dy[None, :]
    cw = gl.arange(0, 8, layout=gl.SliceLayout(0, CPW))
    if KEYS:     # the keys' weights: one column of ones
        w_s.index(0).store(gl.where(cw[None, :] == 0, 1.0, 0.0).to(gl.bfloat16) + gl.zeros([BK, 8], gl.bfloat16,
                                                                                             CPW))
        fence_async_shared()

    slot0 = pid_bh.to(gl.int64) * (NC + 1)

    nstep_all = nchunk * NSTEP
    if PREFETCH:     # the first chunk's S_n goes before the ring's prologue (its wait below counts on that)
        _prefetch_state(SF, sf_s, slot0 + n_first, DS, grows, ti, tj, tjb, FG, TJ, TW, D, CPY)
    g_next = 0.0
    if GATED:   # each chunk's decay is loaded one chunk ahead
        g_next = gl.load(G + (i_b * T + n_first * C + C - 1) * HK + i_hk)
    for p in gl.static_range(NBUF - 1):
        _issue_step(xi_p, xj_p, jmask, y_p, xi_s, xj_s, y_s, p, nstep_all, T, HX, HK, D, C, BK, NBUF, NSTEP, REV)
    # the state entering the scan (slot 0, or slot NC in reverse), without the multiplicities
    base = (slot0 + (NC if REV else 0)) * DS
    rows, fmask, mult = _group_rows(grows, ti, tj, tjb, FG, TJ, TW, D, KEYS, MMA)
    acc = gl.load(OUT + base * D + rows, mask=fmask, other=0.0).to(gl.float32) / mult
    if DU_MULT:  # slot NC (dL/dS_NC, written by the host) is dU_{NC-1}: with the key side's multiplicities too
        mult_k = gl.expand_dims(_group_mults(ti, tj, tjb, FG, TJ, TW, True, gl.SliceLayout(1, MMA)), 1)
        gl.store(OUT + base * D + rows, (acc * mult_k).to(OUT.dtype.element_ty), mask=fmask)
    phi_prev = gl.zeros([FG, BK], gl.bfloat16, A_L)
    for ci in range(nchunk):
        n = n_first + (-ci if REV else ci)
        n_next = n + (-1 if REV else 1)
        if GATED:
            decay = gl.exp(g_next)
            if ci + 1 < nchunk:
                g_next = gl.load(G + (i_b * T + n_next * C + C - 1) * HK + i_hk)
            if REV:      # dgt_n = decay_n <S_n, R_{n+1}> over this group's rows
                # S_n was committed before at least min(NSTEP - 1, NBUF - 2) later groups (the steps' issued
                # since): this wait finishes it, the barrier shows every thread's part to all
                async_copy.wait_group(min(NSTEP - 1, NBUF - 2))
                _barrier()
                s_n = sf_s.load(MMA).to(gl.float32)
                part = gl.sum(gl.sum(s_n * acc, axis=1), axis=0)
                gl.store(DGT + (pid_bh.to(gl.int64) * gl.num_programs(0) + g) * NC + n, decay * part)
            acc = acc * decay
        for st in range(NSTEP):
            step = ci * NSTEP + st
            s = step % NBUF
            async_copy.wait_group(NBUF - 2)
            _barrier()
            acc, phi_prev = warpgroup_mma_wait(num_outstanding=0, deps=(acc, phi_prev))
            xi3 = gl.expand_dims(xi_s.index(s).load(XI_L), 1)
            xj3 = gl.expand_dims(xj_s.index(s).load(XJ_L), 0)
            phi3 = xi3 * xj3                                                               # [TW, TJ, BK] bf16
            phi = gl.convert_layout(gl.reshape(phi3, [FG, BK]), A_L, assert_trivial=True)
            acc = warpgroup_mma(phi, y_s.index(s), acc, is_async=True)
            acc, phi_prev = warpgroup_mma_wait(num_outstanding=1, deps=(acc, phi_prev))
            phi_prev = phi
            _issue_step(xi_p, xj_p, jmask, y_p, xi_s, xj_s, y_s, step + NBUF - 1, nstep_all, T, HX, HK, D, C, BK,
                        NBUF, NSTEP, REV)
            if PREFETCH:     # after step 0's barrier every thread is done reading this chunk's S_n from sf_s
                if st == 0 and ci + 1 < nchunk:
                    _prefetch_state(SF, sf_s, slot0 + n_next, DS, grows, ti, tj, tjb, FG, TJ, TW, D, CPY)
        acc, phi_prev = warpgroup_mma_wait(num_outstanding=0, deps=(acc, phi_prev))
        # this chunk's state, written from the registers (the ring stays live for the next chunk); the group's row
        # offsets are formed again per chunk: [FG, D] offsets held across the steps cost registers
        base = (slot0 + n + SLOT) * DS
        smult = (gl.expand_dims(_group_mults(ti, tj, tjb, FG, TJ, TW, True, gl.SliceLayout(1, MMA)), 1)
                 if KEYS or DU_MULT else 1.0)
        if DU_MULT:  # slot 0 (dL/dS_0, returned) without them
            smult = smult + (1.0 - smult) * (n == 0).to(gl.float32)
        out = (acc * smult).to(OUT.dtype.element_ty)
        # through shared memory into 16-byte rows: a warp then writes 4 whole state rows (512 contiguous bytes) per
        # store, where from the accumulator's layout each store wrote 8 rows x 16 bytes
        rows_c, fmask_c, mult_c = _group_rows(grows, ti, tj, tjb, FG, TJ, TW, D, False, CPY)
        gl.store(OUT + base * D + rows_c, gl.convert_layout(out, CPY), mask=fmask_c)
    async_copy.wait_group(0)
