"""The p=2 row kernels in Gluon, default for bf16 d=32/64: the query forward (`kernels._sym2_query_fwd_rows`; H100
64k 7.10 -> 6.42 ms), the key backward's dv (`_sym2_key_dv_rows`; 6.44 -> 5.58 ms), the query backward
(`_sym2_query_bwd_rows`) and the key backward's dk (the grouped `_sym2_key_bwd`). Elsewhere (interpreter, other GPUs,
older Triton) the Triton versions run (kernels.gluon_rows_apply).

The forward-type kernels (query forward, key dv): the state's slices M_i [KW, D] (the features (i, j) over a window of
columns j) come through a cp.async ring; the operand (q_i q_j) [rows, KW] is built in registers as bf16 products and
accumulated on the tensor cores with one matmul in flight (refilled two slices ahead, so that with 8 warps both
warpgroups are done with a slot before it is overwritten); the windows halve as the first index's tile moves right
(_level_tiles). The key dv is the same pass over dU with the key side's multiplicities.

The backward-type kernels (query backward, key dk) run as the forward-type ones, over the state's symmetric
completion (_sym_pass): slice i holds the features {i, j} for every j, the stored (i, j) where j's tile is not before
i's, else the stored (j, i), so dphi/dx^T X = sum_i (x_i a) M~_i^T is one chain of matmuls with the operand built in
registers. Its price: d full slices of d columns where the forward reads the triangle; against the row-scaled form it
replaced (per slice X_i = a M_i^T on the tensor cores, x_i X_i and the first-index sums on the CUDA cores), H100 64k
query backward 9.30 -> 6.52 ms, key dk 8.53 -> 5.99 ms. The gate term comes by Euler's identity from the result.
Exact where each diagonal block of the state is symmetric (autograd.chunked_form hands these kernels no other).

The normalizer term dl x (Zm + Zm^T) of the backward is two bf16 matmuls (x is exact in bf16; hi / lo splits of
Zm + Zm^T, ~2^-16 relative). dq / dk are written once per row (the block owns its rows: no atomics), in the inputs'
dtype with CAST. Same grids, arguments and results as Triton's kernels. Gluon does not run under TRITON_INTERPRET: the
GPU tests compare it with Triton's kernels and the float64 reference.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, \
    warpgroup_mma_wait

from .gluon_outer import _barrier, _cp_async

# a shared buffer seen with another shape / layout: `_reinterpret` in Triton 3.6 (the device's), `reinterpret` later
_NEW_REINTERPRET = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))


@gluon.jit
def _as(buf, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
    if _NEW_REINTERPRET:
        return buf.reinterpret(dtype, shape, layout)
    else:
        return buf._reinterpret(dtype, shape, layout)


@gluon.jit
def _transposed_rows(x, D: gl.constexpr, BM: gl.constexpr):
    """x^T [D, BM] in shared memory, read one row (first index) at a time: a flat allocation seen with a 1-D layout,
    so .index(i) is a plain [BM] row."""
    ROWS_S: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    x_t = gl.allocate_shared_memory(gl.bfloat16, [D * BM], ROWS_S, gl.reshape(gl.permute(x, [1, 0]), [D * BM]))
    return _as(x_t, gl.bfloat16, [D, BM], ROWS_S)


@gluon.jit
def _diag(ti, NT: gl.constexpr):
    """Block index l(ti, ti) of the lexicographic layout of blocks (i, j >= i)."""
    return ti * NT - (ti * (ti - 1)) // 2


@gluon.jit
def _copy_slice(ring, m_p, tj, dtrue, i, i_end, NBUF: gl.constexpr, D: gl.constexpr, TW: gl.constexpr, NT: gl.constexpr):
    """cp.async of slice M_i (rows of the features (i, j) over the window's columns j: tj = tile(j) per copied row,
    m_p their addresses for i's first-row offset 0) into ring slot i % NBUF; rows whose tile is before i's are zero.
    One commit group whether or not i < i_end, so the waits count slices."""
    if i < i_end:
        ti = i // TW
        first = ((_diag(ti, NT) - ti) * TW + i % TW) * TW
        _cp_async(ring.index(i % NBUF), m_p + first * D, mask=gl.expand_dims(tj >= ti, 1) & dtrue)
    async_copy.commit_group()


@gluon.jit
def _ring_start(S, s_base, t_lo, t_hi, J0: gl.constexpr, KW: gl.constexpr, D: gl.constexpr, TW: gl.constexpr,
                NW: gl.constexpr, NBUF: gl.constexpr, AHEAD: gl.constexpr):
    """A pass's cp.async ring of state slices [KW, D] bf16 (the tensor cores' shared layout) for the window
    [J0, J0 + KW) and first tiles [t_lo, t_hi), with its first AHEAD slices issued: (ring, m_p, tj, dtrue, i_end),
    _copy_slice's hoisted addresses (slice rows for i's first-row offset 0, in a coalesced copy layout), each row's
    tile, an all-true column mask and the end of the slices."""
    CPM: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (D // 8), D // 8], [NW, 1], [1, 0])
    ring = gl.allocate_shared_memory(gl.bfloat16, [NBUF, KW, D], gl.NVMMASharedLayout.get_default_for([KW, D],
                                                                                                    gl.bfloat16))
    j = J0 + gl.arange(0, KW, layout=gl.SliceLayout(1, CPM))
    dcol = gl.arange(0, D, layout=gl.SliceLayout(0, CPM))
    # slice rows (l(ti, tj) TW + a) TW + j % TW = first(ti, a) + (tj TW TW + j % TW): the second part hoisted
    m_p = S + s_base * D + gl.expand_dims((j // TW) * (TW * TW) + j % TW, 1) * D + gl.expand_dims(dcol, 0)
    tj = j // TW
    dtrue = gl.expand_dims(dcol < D, 0)
    i_end = t_hi * TW
    for p in gl.static_range(AHEAD):
        _copy_slice(ring, m_p, tj, dtrue, t_lo * TW + p, i_end, NBUF, D, TW, D // TW)
    return ring, m_p, tj, dtrue, i_end


@gluon.jit
def _sym_tile_rows(j, ti, TW: gl.constexpr, NT: gl.constexpr):
    """Where the slices of first tile ti read the state's symmetric completion, per column j (1-D): slice
    ti TW + m reads layout row base + m stride, the feature (i, j) where j's tile is not before i's, else the stored
    (j, i) (each row carrying its stored multiplicity)."""
    tj = j // TW
    lo = gl.minimum(tj, ti)
    blk = (_diag(lo, NT) + gl.maximum(tj, ti) - lo) * (TW * TW)
    ahead = tj >= ti
    return gl.where(ahead, blk + j % TW, blk + (j % TW) * TW), gl.where(ahead, TW, 1)


@gluon.jit
def _copy_sym_slice(ring, s_p, base, stride, m: gl.constexpr, slot: gl.constexpr, valid, D: gl.constexpr):
    """cp.async of slice m of a first tile (its rows base + m stride, _sym_tile_rows; s_p: the slot's [1, D] column
    addresses) into ring slot `slot` where valid; one commit group either way, so the waits count slices."""
    if valid:
        _cp_async(ring.index(slot), s_p + gl.expand_dims(base + m * stride, 1) * D)
    async_copy.commit_group()


@gluon.constexpr_function
def _copy_vector(D, NW):
    """Elements per cp.async of a [D, D] slice over NW warps: 8 (16 bytes) where the slice has that many per
    thread, fewer at d=32 on 8 warps, so that each element is copied once (not twice by replicas of the layout)."""
    return min(8, D * D // (32 * NW))


@gluon.jit
def _sym_pass(a_op, S, s_base, xT_s, D: gl.constexpr, TW: gl.constexpr, BM: gl.constexpr, NBUF: gl.constexpr,
              NW: gl.constexpr, A_L: gl.constexpr, MMA: gl.constexpr, UNIFORM: gl.constexpr):
    """dphi/dx^T X [BM, D] (fp32, MMA) for X = a S^T on the tensor cores alone: with M~_i row i of the state's
    symmetric completion (_sym_tile_rows), sum_i (x_i a) M~_i^T, the stored rows' weights made the derivative's:
    2 on the columns of slice i's own tile, 1 elsewhere (in-tile features are stored in both orders with weight 1, the
    others once with weight 2; exact where the diagonal blocks are symmetric, which autograd.chunked_form ensures);
    UNIFORM (dU without the key multiplicities): 2 everywhere. The operand (x_i a) is built in registers as bf16
    products (as the forward's q_i q_j), slice i's matmul in flight while slice i + 1's operand is built; the ring
    refilled NBUF - 2 slices ahead (_fwd_pass).

    The own tile's 2 is a rescale of the accumulator's columns by powers of two (exact) where the pipe is drained,
    at the start of each first tile ti: tile ti's halved before its own slices add to them, tile ti - 1's doubled
    after (the last tile's after the loop). Where it stands matters to ptxas: the same rescale at the end of a tile
    (after its last wait) made Triton 3.9 copy accumulator registers before that wait, and ptxas then serializes every
    matmul (C7514); doubling the rows in shared memory instead costs two barriers a slice (64k 47.2 -> 48.3 ms)."""
    gl.static_assert(TW % NBUF == 0, "ring slots must repeat per tile")
    gl.static_assert(NBUF >= 3, "a slot in flight, one in use, one or more landing")
    NT: gl.constexpr = D // TW
    ROWA: gl.constexpr = gl.SliceLayout(1, A_L)
    VEC: gl.constexpr = _copy_vector(D, NW)
    CPM: gl.constexpr = gl.BlockedLayout([1, VEC], [32 // (D // VEC), D // VEC], [NW, 1], [1, 0])
    ring = gl.allocate_shared_memory(gl.bfloat16, [NBUF, D, D], gl.NVMMASharedLayout.get_default_for([D, D],
                                                                                                   gl.bfloat16))
    gl.static_assert(NBUF - 2 <= TW, "the prefetch stays within the first tile")
    j = gl.arange(0, D, layout=gl.SliceLayout(1, CPM))
    s_p = S + s_base * D + gl.expand_dims(gl.arange(0, D, layout=gl.SliceLayout(0, CPM)), 0)
    base, stride = _sym_tile_rows(j, 0, TW, NT)
    for p in gl.static_range(NBUF - 2):
        _copy_sym_slice(ring, s_p, base, stride, p, p % NBUF, True, D)
    col_tile = gl.expand_dims(gl.arange(0, D, layout=gl.SliceLayout(0, MMA)) // TW, 0)
    acc = gl.zeros([BM, D], gl.float32, MMA)
    prev = gl.zeros(a_op.shape, gl.bfloat16, A_L)
    for ti in range(0, NT):
        i0 = ti * TW
        base_n, stride_n = _sym_tile_rows(j, ti + 1, TW, NT)     # the next tile's, which the late refills read
        if not UNIFORM:
            acc = acc * gl.where(col_tile == ti - 1, 2.0, gl.where(col_tile == ti, 0.5, 1.0))
        for a in gl.static_range(TW):
            async_copy.wait_group(NBUF - 3)      # this thread's copies of slice i landed
            _barrier()                           # everyone's; every warpgroup's matmul of slice i - 2 is done
            if a + NBUF - 2 < TW:                # the slice refilled, NBUF - 2 ahead: in this tile or the next
                _copy_sym_slice(ring, s_p, base, stride, a + NBUF - 2, (a + NBUF - 2) % NBUF, True, D)
            else:
                _copy_sym_slice(ring, s_p, base_n, stride_n, a + NBUF - 2 - TW, (a + NBUF - 2) % NBUF, ti + 1 < NT,
                                D)
            op = a_op * gl.expand_dims(xT_s.index(i0 + a).load(ROWA), 1)
            acc = warpgroup_mma(op, ring.index(a % NBUF).permute((1, 0)), acc, is_async=True)
            if a + 1 < TW:
                acc, prev = warpgroup_mma_wait(num_outstanding=1, deps=(acc, prev))
                prev = op
            else:
                acc, op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, op))
        base, stride = base_n, stride_n
    async_copy.wait_group(0)
    _barrier()     # every warp done with the ring before shared memory after it reuses it
    if UNIFORM:
        return acc * 2.0
    return acc * gl.where(col_tile == NT - 1, 2.0, 1.0)


@gluon.jit
def _zm(Z, s_base, D: gl.constexpr, TW: gl.constexpr, L: gl.constexpr):
    """Zm [D (j), D (i)] in layout L, Zm[j, i] = z of feature (i, j) (0 if j's tile is before i's): z . phi(x) =
    x Zm x^T."""
    NT: gl.constexpr = D // TW
    jj = gl.expand_dims(gl.arange(0, D, layout=gl.SliceLayout(1, L)), 1)
    ii = gl.expand_dims(gl.arange(0, D, layout=gl.SliceLayout(0, L)), 0)
    ti = ii // TW
    tj = jj // TW
    lrow = (_diag(ti, NT) + tj - ti) * (TW * TW) + (ii % TW) * TW + jj % TW
    return gl.load(Z + s_base + lrow, mask=tj >= ti, other=0.0).to(gl.float32)


@gluon.jit
def _zsym(Z, s_base, D: gl.constexpr, TW: gl.constexpr, L: gl.constexpr, KEYS: gl.constexpr = False):
    """Zm + Zm^T [D (j), D (i)] in layout L (_zm): the gradient of x Zm x^T is x (Zm + Zm^T). KEYS: Zm carries the key
    side's multiplicities (1 where j's tile is i's, 2 after)."""
    zm = _zm(Z, s_base, D, TW, L)
    if KEYS:
        jt = gl.expand_dims(gl.arange(0, D, layout=gl.SliceLayout(1, L)), 1) // TW
        it = gl.expand_dims(gl.arange(0, D, layout=gl.SliceLayout(0, L)), 0) // TW
        zm = zm * gl.where(jt == it, 1.0, 2.0)
    return zm + gl.convert_layout(gl.permute(zm, [1, 0]), L)


@gluon.jit
def _split_dot(x, bh, bl, MMA: gl.constexpr, BS: gl.constexpr, BM: gl.constexpr, N: gl.constexpr):
    """x [BM, K] (bf16, the matmul's operand layout: exact, the rows of a bf16 input) @ b [K, N] on the tensor cores
    as x bh + x bl, with b's bf16 hi / lo parts bh, bl [K, N] (~2^-16 relative)."""
    bh_s = gl.allocate_shared_memory(gl.bfloat16, bh.shape, BS, bh)
    bl_s = gl.allocate_shared_memory(gl.bfloat16, bl.shape, BS, bl)
    fence_async_shared()         # the stores above before the tensor cores read them (async proxy), from every thread
    _barrier()
    out = warpgroup_mma(x, bh_s, gl.zeros([BM, N], gl.float32, MMA), use_acc=False)
    return warpgroup_mma(x, bl_s, out)


@gluon.jit
def _normalizer_dot(x, Z, z_base, D: gl.constexpr, TW: gl.constexpr, L: gl.constexpr, MMA: gl.constexpr,
                    BM: gl.constexpr, SYM: gl.constexpr, KEYS: gl.constexpr):
    """x Zm (x Zsym with SYM: _zsym) [BM, D] for x [BM, D] (bf16, operand layout) and the packed normalizer state at
    z_base of Z, gathered per program (_zm) and split into bf16 hi / lo parts for the tensor cores."""
    BS: gl.constexpr = gl.NVMMASharedLayout.get_default_for([D, D], gl.bfloat16)
    if SYM:
        b = _zsym(Z, z_base, D, TW, L, KEYS)
    else:
        b = _zm(Z, z_base, D, TW, L)
    bh = b.to(gl.bfloat16)
    bl = (b - bh.to(gl.float32)).to(gl.bfloat16)
    return _split_dot(x, bh, bl, MMA, BS, BM, D)


@gluon.jit
def _query_block(Q, G, scale_p, T, NSLOT, DS, HQ: gl.constexpr, HK: gl.constexpr, D: gl.constexpr, C: gl.constexpr,
                 BM: gl.constexpr, HAS_S0: gl.constexpr, GATED: gl.constexpr, BLK: gl.constexpr):
    """Prologue of the row kernels, program (row block of a chunk, chunk n, b*hq): the flat (b, t, hq) index of its
    rows and their mask, the [BM, D] offsets and mask, the rows of Q (BLK layout), the row factor r = s^p e^(g_i),
    `on` (0 for chunk 0 without an incoming state: no state term) and the base of state slot n of NSLOT per head
    (queries: NC + 1). The key kernels call it with HQ = HK, no gating and HAS_S0."""
    pid_m = gl.program_id(0)
    n = gl.program_id(1)
    pid_bh = gl.program_id(2)
    i_b = (pid_bh // HQ).to(gl.int64)
    i_hq = pid_bh % HQ
    i_hk = i_hq // (HQ // HK)
    on = 1
    if not HAS_S0:
        on = gl.minimum(n, 1)
    s_base = ((i_b * HK + i_hk) * NSLOT + n) * DS
    loc = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, BLK))
    rows = n * C + loc
    mask = (loc < C) & (rows < T)
    row = (i_b * T + rows) * HQ + i_hq
    off = gl.expand_dims(row, 1) * D + gl.expand_dims(gl.arange(0, D, layout=gl.SliceLayout(0, BLK)), 0)
    m2 = gl.expand_dims(mask, 1)
    q = gl.load(Q + off, mask=m2, other=0.0)
    r = gl.where(mask, scale_p, 0.0)
    if GATED:
        r = r * gl.exp(gl.load(G + (i_b * T + rows) * HK + i_hk, mask=mask, other=0.0))
    return row, mask, off, m2, q, r, on, s_base


@gluon.constexpr_function
def _levels(MINW, D):
    """How many window levels the forward-type row kernels' slices take: D, D / 2, ... down to MINW columns."""
    n, kw = 1, D
    while kw > MINW:
        n, kw = n + 1, kw // 2
    return n


@gluon.constexpr_function
def _level_tiles(LV, MINW, D, TW):
    """(first tile, end tile) of window level LV: its window [D - KW, D), KW = D >> LV, serves the first tiles from
    (D - KW) / TW (a slice's features (i, j) start at j's tile = i's) to where the next, half as wide, can start
    (the last level: to D / TW). Windows of powers of two (Triton's shapes); MINW = D / 2 gives two levels."""
    kw = D >> LV
    last = LV == _levels(MINW, D) - 1
    return ((D - kw) // TW, D // TW if last else (D - kw // 2) // TW)


@gluon.jit
def _window_cols(X, row, m2, KW: gl.constexpr, D: gl.constexpr, NW: gl.constexpr):
    """The block's rows of X (flat row index `row`, mask m2) on a window level's columns [D - KW, D): [BM, KW] in the
    coalesced layout, loaded where the level starts (fewer live registers than keeping them from the prologue)."""
    BLK: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (D // 8), D // 8], [NW, 1], [1, 0])
    cw = gl.expand_dims(gl.arange(0, KW, layout=gl.SliceLayout(0, BLK)), 0)
    return gl.load(X + gl.expand_dims(row, 1) * D + (D - KW) + cw, mask=m2, other=0.0)


@gluon.jit
def _rows_backward(DX, DXO, DG, S, Z, s_base, row, mask, off, m2, x, a, dl, rf, rg, on, D: gl.constexpr,
                   TW: gl.constexpr, BM: gl.constexpr, NBUF: gl.constexpr, KEYS: gl.constexpr, NORM: gl.constexpr,
                   GATED: gl.constexpr, CAST: gl.constexpr):
    """The backward of phi(x) for the block's rows x [BM, D] (bf16, coalesced layout; flat row index `row`, mask,
    offsets `off`): with X = a S^T + dl Z (a [BM, D] bf16, dl [BM]; the Z term with NORM), DX (fp32, holding the
    intra-chunk part) += rf dphi/dx^T X, written to DXO in its dtype (CAST) or back to DX, and DG = rg X . phi(x)
    (the gate gradient) with GATED (_sym_grads). KEYS: dU without the key side's multiplicities. The normalizer state
    of the slot starts at s_base of Z (packed, as S's slot)."""
    tot, dg = _sym_grads(S, Z, s_base, x, a, dl, on, D, TW, BM, NBUF, KEYS, NORM)
    dx = gl.load(DX + off, mask=m2, other=0.0) + tot * gl.expand_dims(rf, 1)
    if CAST:
        gl.store(DXO + off, dx.to(DXO.dtype.element_ty), mask=m2)
    else:
        gl.store(DX + off, dx, mask=m2)
    if GATED:
        gl.store(DG + row, dg * rg, mask=mask)


@gluon.jit
def _sym_grads(S, Z, s_base, x, a, dl, on, D: gl.constexpr, TW: gl.constexpr, BM: gl.constexpr, NBUF: gl.constexpr,
               KEYS: gl.constexpr, NORM: gl.constexpr):
    """_rows_backward's (dphi/dx^T X [BM, D], X . phi(x) [BM]) in the coalesced layout, the state part by _sym_pass
    and the gate term by Euler's identity (X . phi(x) = x . dphi/dx^T X / 2: phi is homogeneous of degree 2)."""
    NW: gl.constexpr = gl.num_warps()
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, D, 16])
    A_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    BLK: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (D // 8), D // 8], [NW, 1], [1, 0])
    xT_s = _transposed_rows(x, D, BM)
    # constant loop bounds under a branch (as gluon_query_fwd_rows), leaving it in the coalesced layout: an
    # accumulator merged at the branch's end is read between its matmuls' start and end for ptxas (C7514: every
    # matmul serialized, Triton 3.6)
    tot = gl.zeros([BM, D], gl.float32, BLK)
    if on > 0:
        tot = gl.convert_layout(_sym_pass(gl.convert_layout(a, A_L), S, s_base, xT_s, D, TW, BM, NBUF, NW, A_L, MMA,
                                          KEYS), BLK)
    if NORM:      # dl x (Zm + Zm^T): the normalizer's part of X, after the pass (fewer live registers in it)
        xz = _normalizer_dot(gl.convert_layout(x, A_L), Z, s_base, D, TW, BLK, MMA, BM, True, KEYS) * on
        tot += gl.convert_layout(xz * gl.expand_dims(gl.convert_layout(dl, gl.SliceLayout(1, MMA)), 1), BLK)
    return tot, 0.5 * gl.sum(x.to(gl.float32) * tot, axis=1)


@gluon.jit
def gluon_query_bwd_rows(Q, G, S, Z, DO, LSE, DELTA, DQ, DQO, DGQ, scale_p, T, NC, DS,
                         HQ: gl.constexpr, HK: gl.constexpr, D: gl.constexpr, C: gl.constexpr, TW: gl.constexpr,
                         BM: gl.constexpr, NORM: gl.constexpr, GATED: gl.constexpr, HAS_S0: gl.constexpr,
                         NBUF: gl.constexpr, CAST: gl.constexpr):
    """Program (query block of a chunk, chunk n, b*hq): X = r (dn S_n^T + dl z_n) = dL/dphi(q) of its rows,
    dq = DQ (the intra-chunk part, fp32) + dphi/dq^T X, DGQ = X . phi(q) (Euler); written to DQO in its dtype (CAST)
    or back to DQ. dn = dy / Den, dl = -Delta / Den, r = s^p e^(g_i), Den = e^(lse_i)."""
    BLK: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (D // 8), D // 8], [gl.num_warps(), 1], [1, 0])
    BROW: gl.constexpr = gl.SliceLayout(1, BLK)
    # the block's rows in the coalesced layout: q, dn = dy / Den, dl = -Delta / Den, r
    row, mask, off, m2, q, r, on, s_base = _query_block(Q, G, scale_p, T, NC + 1, DS, HQ, HK, D, C, BM, HAS_S0,
                                                        GATED, BLK)
    dn = gl.load(DO + off, mask=m2, other=0.0).to(gl.float32)
    dl = gl.zeros([BM], gl.float32, BROW)
    if NORM:
        inv = gl.exp(-gl.load(LSE + row, mask=mask, other=0.0))
        dn = dn * gl.expand_dims(inv, 1)
        dl = -gl.load(DELTA + row, mask=mask, other=0.0) * inv
    _rows_backward(DQ, DQO, DGQ, S, Z, s_base, row, mask, off, m2, q, dn.to(gl.bfloat16), dl, r, r, on, D, TW, BM,
                   NBUF, False, NORM, GATED, CAST)


# ----------------------------------------------------------------------------------------------
# the row-scaled query forward (kernels._sym2_query_fwd_rows with its ACC operand)
# ----------------------------------------------------------------------------------------------
@gluon.jit
def _fwd_pass(num, qw, S, s_base, qT_s, t_lo, t_hi, J0: gl.constexpr, KW: gl.constexpr, D: gl.constexpr,
              TW: gl.constexpr, NBUF: gl.constexpr, NW: gl.constexpr, A_L: gl.constexpr, KEYS: gl.constexpr = False):
    """num [BM, D] += sum over the slices i = TW ti + a of first tiles ti in [t_lo, t_hi), window [J0, J0 + KW), of
    (q_i qw) M_i: qw [BM, KW] bf16 in the matmul's operand layout; the products q_i q_j in bf16 (one rounding, as the
    outer products' phi) accumulate on the tensor cores, slice i's matmul in flight while slice i + 1's operand is
    built. The ring is refilled NBUF - 2 slices ahead, into the slot of slice i - 2: at slice i's barrier every
    warpgroup's matmul of slice i - 2 is done (with 8 warps two warpgroups read each slot). KEYS: the window's columns
    carry the key side's multiplicities (1 in tile ti, 2 after it; exact in bf16), set per first tile."""
    gl.static_assert(TW % NBUF == 0, "ring slots must repeat per tile")
    gl.static_assert(NBUF >= 3, "a slot in flight, one in use, one or more landing")
    NT: gl.constexpr = D // TW
    ROWA: gl.constexpr = gl.SliceLayout(1, A_L)
    ring, m_p, tj, dtrue, i_end = _ring_start(S, s_base, t_lo, t_hi, J0, KW, D, TW, NW, NBUF, NBUF - 2)
    prev = gl.zeros(qw.shape, gl.bfloat16, A_L)
    for ti in range(t_lo, t_hi):
        i0 = ti * TW
        qw_t = qw
        if KEYS:
            jw = (J0 + gl.arange(0, KW, layout=gl.SliceLayout(0, A_L))) // TW
            qw_t = qw * gl.expand_dims(gl.where(jw == ti, 1.0, 2.0).to(gl.bfloat16), 0)
        for a in gl.static_range(TW):
            async_copy.wait_group(NBUF - 3)      # this thread's copies of slice i landed
            _barrier()                           # everyone's; every warpgroup's matmul of slice i - 2 is done
            _copy_slice(ring, m_p, tj, dtrue, i0 + a + NBUF - 2, i_end, NBUF, D, TW, NT)
            op = qw_t * gl.expand_dims(qT_s.index(i0 + a).load(ROWA), 1)
            num = warpgroup_mma(op, ring.index(a % NBUF), num, is_async=True)
            if a + 1 < TW:
                num, prev = warpgroup_mma_wait(num_outstanding=1, deps=(num, prev))
                prev = op
            else:
                num, op = warpgroup_mma_wait(num_outstanding=0, deps=(num, op))
    async_copy.wait_group(0)
    _barrier()     # every warp done with the ring before shared memory after it reuses it
    return num


@gluon.jit
def _fwd_level(num, X, row, m2, S, s_base, xT_s, on, LV: gl.constexpr, MINW: gl.constexpr, D: gl.constexpr,
               TW: gl.constexpr, NBUF: gl.constexpr, NW: gl.constexpr, A_L: gl.constexpr, KEYS: gl.constexpr):
    """Window level LV >= 1 of _rows_forward (_level_tiles): _fwd_pass over its first tiles and window [D - KW, D),
    KW = D >> LV."""
    KW: gl.constexpr = D >> LV
    t0: gl.constexpr = _level_tiles(LV, MINW, D, TW)[0]
    t1: gl.constexpr = _level_tiles(LV, MINW, D, TW)[1]
    return _fwd_pass(num, gl.convert_layout(_window_cols(X, row, m2, KW, D, NW), A_L), S, s_base, xT_s, t0,
                     t0 + (t1 - t0) * on, D - KW, KW, D, TW, NBUF, NW, A_L, KEYS)


@gluon.jit
def _rows_forward(X, S, s_base, row, m2, x, on, D: gl.constexpr, TW: gl.constexpr, MINW: gl.constexpr,
                  BM: gl.constexpr, NBUF: gl.constexpr, KEYS: gl.constexpr):
    """sum_i (x_i x_win) M_i [BM, D] (fp32, x's coalesced layout) over the window levels of _level_tiles (none when
    on = 0); x [BM, D] bf16 the block's rows of X (flat row index `row`, mask m2), M_i the slices of the state at
    s_base. KEYS: _fwd_pass's multiplicities."""
    NW: gl.constexpr = gl.num_warps()
    T1: gl.constexpr = _level_tiles(0, MINW, D, TW)[1]
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, D, 16])
    A_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    BLK: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (D // 8), D // 8], [NW, 1], [1, 0])
    xT_s = _transposed_rows(x, D, BM)
    num = gl.zeros([BM, D], gl.float32, MMA)
    num = _fwd_pass(num, gl.convert_layout(x, A_L), S, s_base, xT_s, 0, T1 * on, 0, D, D, TW, NBUF, NW, A_L, KEYS)
    for lv in gl.static_range(1, _levels(MINW, D)):
        num = _fwd_level(num, X, row, m2, S, s_base, xT_s, on, lv, MINW, D, TW, NBUF, NW, A_L, KEYS)
    return gl.convert_layout(num, BLK)


@gluon.jit
def gluon_query_fwd_rows(Q, G, S, Z, OI, LSEI, Y, LSE, scale_p, T, NC, DS,
                         HQ: gl.constexpr, HK: gl.constexpr, D: gl.constexpr, C: gl.constexpr, TW: gl.constexpr,
                         MINW: gl.constexpr, BM: gl.constexpr, NORM: gl.constexpr, GATED: gl.constexpr,
                         HAS_S0: gl.constexpr, NBUF: gl.constexpr):
    """Program (query block of a chunk, chunk n, b*hq), as `_sym2_query_fwd_rows`: the state term num = phi(q) S_n
    (row-scaled: sum_i (q_i q_win) S_i, over the window levels of _rows_forward) and
    den = phi(q) . z_n = q Zm q^T join the intra-chunk output OI (normalized, LSEI = log of its normalizer):
    y = (OI e^LSEI + r num) / (e^LSEI + r den), stabilized by the larger log (NORM), else OI + r num; r = s^p e^(g_i).
    Writes Y (the inputs' dtype) and LSE = log of the total normalizer."""
    NW: gl.constexpr = gl.num_warps()
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, D, 16])
    A_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    BLK: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (D // 8), D // 8], [NW, 1], [1, 0])
    BROW: gl.constexpr = gl.SliceLayout(1, BLK)
    row, mask, off, m2, q, r, on, s_base = _query_block(Q, G, scale_p, T, NC + 1, DS, HQ, HK, D, C, BM, HAS_S0,
                                                        GATED, BLK)
    if NORM:     # den = q Zm q^T (two bf16 split matmuls, ~2^-16), formed before the passes: fewer live registers
        xz = _normalizer_dot(gl.convert_layout(q, A_L), Z, s_base, D, TW, BLK, MMA, BM, False, False)
        den = gl.convert_layout(gl.sum(gl.convert_layout(q, MMA).to(gl.float32) * xz, axis=1), BROW) * r
    # the passes under a branch with constant loop bounds, not bounds scaled by `on`: no per-slice predicates or
    # address arithmetic in the slice loops (SASS 536 -> 377 instructions per first tile, Triton 3.6)
    num = gl.zeros([BM, D], gl.float32, BLK)
    if on > 0:
        num = _rows_forward(Q, S, s_base, row, m2, q, 1, D, TW, MINW, BM, NBUF, False)
    yi = gl.load(OI + off, mask=m2, other=0.0).to(gl.float32)
    if NORM:     # stabilized as _combine_store; per-row factors, so each element takes one multiply and one FMA
        lse_i = gl.load(LSEI + row, mask=mask, other=0.0)
        big = gl.maximum(lse_i, gl.log(gl.maximum(den, 1e-30)))
        a = gl.exp(lse_i - big)
        bb = gl.exp(-big)
        tot = a + den * bb                                               # >= 1 (stabilized)
        inv = 1.0 / tot
        y = yi * gl.expand_dims(a * inv, 1) + num * gl.expand_dims(r * bb * inv, 1)
        gl.store(LSE + row, big + gl.log(tot), mask=mask)
    else:
        y = yi + num * gl.expand_dims(r, 1)
    gl.store(Y + off, y.to(Y.dtype.element_ty), mask=m2)


@gluon.jit
def _decay_to_chunk_end(G, T, row, mask, c, HK: gl.constexpr, C: gl.constexpr, GATED: gl.constexpr):
    """The key rows' decay c_j = e^(gt_n - g_j) to the end of chunk n = program_id(1) (program_id(2) = b*hk; flat
    (b, t, hk) row index `row`), times c (the rows' mask)."""
    if GATED:
        pid_bh = gl.program_id(2)
        g_end = gl.load(G + ((pid_bh // HK).to(gl.int64) * T + gl.program_id(1) * C + C - 1) * HK + pid_bh % HK)
        c = c * gl.exp(g_end - gl.load(G + row, mask=mask, other=0.0))
    return c


@gluon.jit
def gluon_key_dv_rows(K, G, DU, DV, T, NC, DS, NU, HK: gl.constexpr, D: gl.constexpr, C: gl.constexpr,
                      TW: gl.constexpr, MINW: gl.constexpr, BK: gl.constexpr, GATED: gl.constexpr, NBUF: gl.constexpr,
                      DU_MULT: gl.constexpr = False):
    """Program (key block of a chunk, chunk n, b*hk), as `_sym2_key_dv_rows`: the key backward's dv_j += c_j sum_i
    (k_i k_win,w) dU_i (the forward's pass with KEYS: the key side's multiplicities w on the window's columns),
    c_j = e^(gt_n - g_j); dU_n is slot n of DU (NU slots per (b, hk)). DV holds the intra-chunk part in the inputs'
    dtype; the sum is added in fp32 and written back in place. DU_MULT: dU already carries the multiplicities
    (gluon_outer.gluon_outer's DU_MULT)."""
    BLK: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (D // 8), D // 8], [gl.num_warps(), 1], [1, 0])
    row, mask, off, m2, k, c, on, u_base = _query_block(K, G, 1.0, T, NU, DS, HK, HK, D, C, BK, True, False, BLK)
    num = _rows_forward(K, DU, u_base, row, m2, k, on, D, TW, MINW, BK, NBUF, not DU_MULT)
    c = _decay_to_chunk_end(G, T, row, mask, c, HK, C, GATED)
    dv = num * gl.expand_dims(c, 1) + gl.load(DV + off, mask=m2, other=0.0).to(gl.float32)
    gl.store(DV + off, dv.to(DV.dtype.element_ty), mask=m2)


@gluon.jit
def gluon_key_dk_rows(K, V, G, DU, DUZ, DK, DKO, DGK, T, NC, DS, NU, HK: gl.constexpr, D: gl.constexpr,
                      C: gl.constexpr, TW: gl.constexpr, BK: gl.constexpr, GATED: gl.constexpr, NBUF: gl.constexpr,
                      CAST: gl.constexpr, DU_MULT: gl.constexpr = False):
    """Program (key block of a chunk, chunk n, b*hk), the grouped `_sym2_key_bwd`'s dk:
    X = v dU_n^T + dUz_n = dL/dph for ph = w phi(k) c_j, c_j = e^(gt_n - g_j): DK (intra-chunk part, fp32) +=
    c dph/dk^T X (written to DKO in its dtype with CAST), DGK = -c X . ph; dU_n / dUz_n are slot n of DU / DUZ (NU
    slots per (b, hk)). The query backward's pass with the key side's multiplicities (KEYS; DU_MULT: dU / dUz
    already carry them) and dl = 1."""
    BLK: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (D // 8), D // 8], [gl.num_warps(), 1], [1, 0])
    row, mask, off, m2, k, c, on, u_base = _query_block(K, G, 1.0, T, NU, DS, HK, HK, D, C, BK, True, False, BLK)
    c = _decay_to_chunk_end(G, T, row, mask, c, HK, C, GATED)
    v = gl.load(V + off, mask=m2, other=0.0)
    _rows_backward(DK, DKO, DGK, DU, DUZ, u_base, row, mask, off, m2, k, v, gl.where(mask, 1.0, 0.0), c, -c, on, D,
                   TW, BK, NBUF, not DU_MULT, True, GATED, CAST)
