"""Run by test_power_triton_interpret.py in a subprocess with TRITON_INTERPRET=1 (the interpreter is
chosen when triton is imported, so it must not leak into the test process). Checks the Triton
attention-form kernels, forward and gradients, against the reference at tiny sizes; prints one line
per case and exits non-zero on a failure. Error measure: relative Frobenius error."""
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1"
import torch  # noqa: E402

from longctx.kernels.power.reference import power_attention_reference  # noqa: E402
from _gate_ref import segment_cumsum_f64  # noqa: E402
from longctx.kernels.power.gates import gate_cumsum  # noqa: E402
from longctx.kernels.power import config  # noqa: E402
from longctx.kernels.power.autograd import attention_form  # noqa: E402

# bf16 is not checked here: the interpreter's numpy backend mis-handles bf16 tiles (GPU tests cover it).
CASES = [  # (dtype, p, norm, gated, hq, hk, t, tol)
    (torch.float32, 2, True, True, 2, 1, 300, 1e-5),     # t > BM: off-diagonal fast path + diagonal
    (torch.float32, 2, True, 'strong', 2, 1, 200, 1e-5),  # padded rows with exp(-G) = inf
    (torch.float32, 1, False, False, 2, 2, 70, 1e-5),
    (torch.float32, 3, False, True, 4, 2, 150, 1e-5),
    (torch.float32, 4, True, False, 2, 1, 200, 5e-5),
    (torch.float16, 2, True, True, 2, 1, 150, 3e-3),     # running-max path
    (torch.float16, 4, False, True, 2, 1, 90, 3e-3),
]

# the two backward kernels with tiles of their own (config.attention's block_override): (case index, overrides);
# dk/dv with BN > BM: its diagonal spans BN / BM query blocks
SPLIT_TILES = [(0, {"dkdv": (32, 16, 4, 1), "dq": (64, 32, 4, 1)}),
               (3, {"dkdv": (16, 32, 4, 1), "dq": (32, 16, 4, 1)}),
               (1, {"dkdv": (16, 64, 4, 1)})]


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main():
    torch.manual_seed(0)
    failed = sum(not check(case) for case in CASES)
    for i, tiles in SPLIT_TILES:
        with config.attention.override(block_override=tiles):
            failed += not check(CASES[i], f" tiles={tiles}")
    # the two-kernel backward (deterministic mode, fused_backward off): every case, and tiles of each kernel's own
    with config.attention.override(fused_backward=False):
        failed += sum(not check(case, " two-kernel backward") for case in CASES)
        for i, tiles in SPLIT_TILES:
            with config.attention.override(block_override=tiles):
                failed += not check(CASES[i], f" two-kernel backward tiles={tiles}")
    failed += check_even_tiles()
    failed += check_offdiag_fp32()
    failed += check_tma_dq()
    failed += check_gate_cumsum()
    sys.exit(1 if failed else 0)


def check(case, note="", b=1):
    """One case's forward and gradients against the float64 reference; prints a line, returns whether it passed."""
    dtype, p, norm, gated, hq, hk, t, tol = case
    d = 16
    q = torch.randn(b, t, hq, d, dtype=dtype, requires_grad=True)
    k = torch.randn(b, t, hk, d, dtype=dtype, requires_grad=True)
    v = torch.randn(b, t, hk, d, dtype=dtype, requires_grad=True)
    lg = (-(3.0 if gated == "strong" else 0.3) * torch.rand(b, t, hk)).requires_grad_() if gated else None
    leaves = [q, k, v] + ([lg] if gated else [])
    y = attention_form(q, k, v, lg, p=p, scale=d ** -0.5, norm=norm)
    do = torch.randn_like(y)
    grads = torch.autograd.grad(y, leaves, do)
    ref = [x.detach().double().requires_grad_() for x in leaves]
    y_ref = power_attention_reference(*ref[:3], ref[3] if gated else None, p=p, norm=norm)
    grads_ref = torch.autograd.grad(y_ref, ref, do.double())
    errs = [rel(y, y_ref)] + [rel(g, gr) for g, gr in zip(grads, grads_ref)]
    ok = all(e < tol for e in errs)
    print(f"{'ok  ' if ok else 'FAIL'} {dtype} p={p} norm={norm} gated={gated} hq={hq} hk={hk} t={t} "
          f"errs(y,dq,dk,dv,dlog_g)={['%.1e' % e for e in errs]} tol={tol}{note}", flush=True)
    return ok


def check_even_tiles():
    """Sequences of whole tiles (t = 256 with tiles that divide it): the launches take EVEN (no row or key masks), one-
    and two-kernel backward, GQA, mild and strong gates; t = 200 keeps the masks. Returns the failures."""
    from longctx.kernels.power import parallel
    failed = 0
    tiles = {"fwd": (64, 32, 4, 1), "dq": (64, 64, 4, 1), "dkdv": (64, 64, 4, 1)}
    for t in (256, 200):
        for fused in (True, False):
            with config.attention.override(fused_backward=fused, block_override=tiles):
                even = [parallel.launch_config(16, kernel, *parallel.dot_dtype(torch.float32, True, kernel != "fwd"),
                                               t=t)["EVEN"] for kernel in ("fwd", "dq", "dkdv")]
                if even != [t == 256] * 3:
                    print(f"FAIL whole tiles t={t}: EVEN={even}")
                    failed += 1
                for gated in (True, "strong"):
                    torch.manual_seed(t)        # the draws of the cases above (strong gates: errors up to ~7e-6)
                    failed += not check((torch.float32, 2, True, gated, 2, 1, t, 1e-5),
                                        f" EVEN={even[0]} fused={fused}")
    return failed


def check_offdiag_fp32():
    """The backward's fp32 off-diagonal branch (OFFDIAG_FP32: gate-scaled keys, dS tiles in fp32), which only bf16 /
    fp16 matmul operands reach on a GPU, forced here on fp32 inputs: gated GQA cases with tiles where dk/dv's diagonal
    spans one and several query blocks, one-kernel and two-kernel backward. Returns the failures."""
    from longctx.kernels.power import parallel
    real = parallel.backward_rounding
    parallel.backward_rounding = lambda gated, dot_dt: dict(OFFDIAG_FP32=gated, OFFDIAG_PREC="tf32x3",
                                                            SHARED_ROUND=False)
    failed = 0
    try:
        for fused in (True, False):
            for i, tiles in [(0, {}), *SPLIT_TILES]:
                with config.attention.override(fused_backward=fused, block_override=tiles):
                    failed += not check(CASES[i], f" offdiag_fp32 fused={fused} tiles={tiles}")
    finally:
        parallel.backward_rounding = real
    return failed


def check_tma_dq():
    """The one-kernel backward's dq by bulk tensor reductions (TMA_DQ: CUDA with TMA only), forced here, with the
    descriptor reduction the interpreter lacks given as what it stands for, an fp32 add of the block's elements inside
    the descriptor's bounds: the descriptor's shape, offsets and clipping of the rows past t (two batch rows, t not a
    whole number of tiles, GQA, diagonal spanning one and several query blocks; the clipping by the bounds' check in
    the stand-in, as the rows past t add zeros). Returns the failures."""
    from triton._C.libtriton import ir
    from triton.runtime import interpreter
    from longctx.kernels.power import parallel

    def create_descriptor_reduce(self, kind, desc, value, indices):
        assert kind == ir.DESCRIPTOR_REDUCE_KIND.ADD, kind
        # the clipping the hardware relies on: no dimension's bounds run into the next one's elements (a row past t
        # would land in the next batch row, or past the buffer). The results cannot show it: the tile's rows past t
        # are zeros, which add nothing wherever they land.
        shape, strides = ([int(x.data.item()) for x in xs] for xs in (desc.shape, desc.strides))
        assert all(shape[i] * strides[i] <= strides[i - 1] for i in range(1, len(shape))), (shape, strides)
        ptrs, mask = desc.materialize_pointers(indices)
        return self.create_atomic_rmw(ir.ATOMIC_OP.FADD, ptrs, value, mask, ir.MEM_SEMANTIC.RELAXED,
                                      ir.MEM_SYNC_SCOPE.GPU)
    builder = interpreter.InterpreterBuilder
    had = hasattr(builder, "create_descriptor_reduce")
    if not had:
        builder.create_descriptor_reduce = create_descriptor_reduce
    real = parallel.tma_dq
    parallel.tma_dq = lambda device: True
    failed = 0
    try:
        for i, tiles in [(0, {}), (3, {}), *SPLIT_TILES]:
            with config.attention.override(fused_backward=True, block_override=tiles):
                failed += not check(CASES[i], f" tma_dq b=2 tiles={tiles}", b=2)
    finally:
        parallel.tma_dq = real
        if not had:
            del builder.create_descriptor_reduce
    return failed


def check_gate_cumsum():
    """The segment scan of the gates (gates._segment_cumsum) and its reverse (backward) vs float64 torch, for
    whole-sequence and chunk-local segments, a segment longer than one tile and a ragged last segment."""
    failed = 0
    default_tile = config.gates.current().column_tile
    # (t, h, seg, column tile): a 64-step tile makes the column programs carry across tiles
    for t, h, seg, tile in ((70, 3, None, default_tile), (600, 12, 256, default_tile), (37, 5, 16, default_tile),
                            (300, 2, None, 64), (300, 1, 64, 64)):
        x = (-torch.rand(2, t, h, dtype=torch.float64) * 2).requires_grad_()
        dy = torch.randn(2, t, h, dtype=torch.float64)
        with config.gates.override(column_tile=tile):
            y = gate_cumsum(x.float(), seg)
            xf = x.detach().float().requires_grad_()
            dx = torch.autograd.grad(gate_cumsum(xf, seg), xf, dy.float())[0]
        y_ref = segment_cumsum_f64(x, seg)
        dx_ref = torch.autograd.grad(y_ref, x, dy)[0]
        errs = [rel(y, y_ref), rel(dx, dx_ref)]
        ok = y.dtype == torch.float32 and all(e < 1e-6 for e in errs)
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} gate_cumsum t={t} h={h} seg={seg} tile={tile} "
              f"errs(G,dlog_g)={['%.1e' % e for e in errs]}", flush=True)
    return failed


if __name__ == "__main__":
    main()
