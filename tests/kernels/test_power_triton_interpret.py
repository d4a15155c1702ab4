"""The Triton kernels themselves, on CPU, under TRITON_INTERPRET=1 (in a subprocess, so the variable
never reaches other tests), forward and gradients vs the reference. See _interpret_check.py (attention
form), _interpret_chunked_check.py (chunked form: state kernels, query-state, state gradients) and
_interpret_ops_check.py (both forms as custom ops under torch.compile)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest


def sass_of(name: str) -> str:
    """The SASS listing compile_check kept for kernel `name`; the test skips, saying why, where none was kept (no
    cuobjdump bundled with this Triton), so a SASS check never passes without having looked."""
    from tools.compile_check import SASS_OF
    sass = SASS_OF.get(name)
    if not sass:
        pytest.skip(f"no SASS of {name}: cuobjdump is not bundled with this Triton (triton/backends/nvidia/bin)")
    return sass


def test_sass_of_skips_visibly_without_a_listing(monkeypatch):
    from tools import compile_check
    monkeypatch.setattr(compile_check, "SASS_OF", {"kept": "/*0000*/ NOP ;"})
    assert sass_of("kept") == "/*0000*/ NOP ;"
    with pytest.raises(pytest.skip.Exception, match="no SASS of missing: cuobjdump"):
        sass_of("missing")


@pytest.mark.parametrize("script, args", [
    ("_interpret_check.py", []),
    ("_interpret_chunked_check.py", ["0", "7"]),   # padding + state in/out, and one decoding step
    ("_interpret_chunked_check.py", ["intra"]),    # the intra-chunk attention on chunks of whole tiles (EVEN)
    pytest.param("_interpret_chunked_check.py", [], marks=pytest.mark.slow),   # every case and kernel variant
    pytest.param("_interpret_ops_check.py", [], marks=pytest.mark.slow),
], ids=["attention_form", "chunked_form_two_cases", "intra_whole_tiles", "chunked_form", "compile_ops"])
def test_triton_kernels_under_interpreter(script, args):
    env = dict(os.environ, TRITON_INTERPRET="1")
    path = Path(__file__).with_name(script)
    proc = subprocess.run([sys.executable, str(path), *args], env=env, capture_output=True, text=True, timeout=1800)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
def test_chunked_kernels_compile_for_sm90():
    """The interpreter accepts code the compiler rejects: compile the chunked and attention-form kernels for sm_90
    on this CPU machine (Triton's nvidia backend + bundled ptxas) and check they fit the H100/H200 shared memory."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    from tools.compile_check import H100_SHARED, compile_attention, compile_chunked, sass_loop_counts
    built = compile_chunked(2, 64, "bf16") + compile_attention(2, 64, "bf16")
    for name, shared, _, _ in built:
        assert shared <= H100_SHARED, name
    # the chunked form's intra-chunk forward runs its own tile, capped at 96 registers (5 programs per SM): the cap
    # reaches the build and pushes no more than a few values to the stack (with the row sums by matmul, ROWSUM_MMA,
    # and no masks on chunks of whole tiles: Triton 3.6 none, 3.9 32 bytes), none of them in the off-diagonal key
    # loop, where the time goes
    intra = {name: (shared, regs, stack) for name, shared, regs, stack in compile_attention(2, 64, "bf16", xt=True)}
    shared, regs, stack = intra["_attn_fwd"]
    assert shared <= H100_SHARED and regs <= 96 and (stack or 0) <= 64, intra["_attn_fwd"]
    hot = sass_loop_counts(sass_of("_attn_fwd"))[0]["ops"]
    assert hot.get("STL", 0) == 0 and hot.get("LDL", 0) == 0 and hot.get("HGMMA", 0) > 0, hot


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
def test_gate_exps_in_the_attention_loops_are_one_flushing_ex2():
    """On NVIDIA builds the attention kernels' gate exps are one ex2.approx.ftz each (_common._exp with launch_config's
    FTZ): tl.exp's ex2.approx.f32 costs a compare and two multiplies more per element (4k fwd+bwd 2.759 -> 2.680 ms,
    H100). In the loops of the chunked form's intra-chunk kernels and the attention form's, the non-flushing one is
    left only for the rows' e^-lse (a normalizer may pass 2^126; two per row block)."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    from tools.compile_check import PTX_OF, compile_attention, loop_op_counts
    for xt in (True, False):
        compile_attention(2, 64, "bf16", xt=xt, t=4096)
        for name in ("_attn_fwd", "_attn_bwd_dq", "_attn_bwd_dkdv"):
            loops = loop_op_counts(PTX_OF[name], ops=("ex2.approx.ftz.f32", "ex2.approx.f32"))
            assert loops and all(loop["ex2.approx.f32"] <= 2 for loop in loops), (xt, name, loops)
            assert sum(loop["ex2.approx.ftz.f32"] for loop in loops) > 0, (xt, name, loops)


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
def test_tma_dq_kernel_compiles_for_sm90_as_the_native_launcher_takes_it(monkeypatch):
    """config.attention.tma_dq is off until timed, so no other CPU test builds its kernel: the one-kernel backward's
    dk/dv kernel with dq by bulk tensor reductions compiles for sm_90 (bf16 d=64, fp32 d=128), reduces by
    cp.reduce.async.bulk.tensor, fits shared memory, and asks for global scratch (its descriptor) within what
    native.kernel_entry accepts, so the C++ node keeps it."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    from tools import compile_check
    from longctx.kernels.power import config
    built = {}

    def keep(*args, **kwargs):
        kernel = real(*args, **kwargs)
        built[kernel.name] = kernel
        return kernel
    real = compile_check._compile
    monkeypatch.setattr(compile_check, "_compile", keep)
    for p, d, dtype in ((2, 64, "bf16"), (3, 128, "fp32")):
        with config.attention.override(fused_backward=True, tma_dq=True):
            compile_check.compile_attention(p, d, dtype)
        kernel = built["_attn_bwd_dkdv"]
        md = kernel.metadata
        assert "cp.reduce.async.bulk.tensor" in kernel.asm["ptx"], (p, d, dtype)
        assert md.shared <= compile_check.H100_SHARED, (p, d, dtype)
        assert 0 < md.global_scratch_size <= 1 << 16 and md.global_scratch_align <= 256, (p, d, dtype)
        assert md.profile_scratch_size == 0, (p, d, dtype)


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
def test_sym2_kernels_compile_for_sm90():
    """The p=2 kernels (chunk_p2, the CUDA default for bf16 p=2 from 16k) at d=64 with their H200-tuned blocks:
    compile for sm_90, fit shared memory, and the row-scaled query forward keeps its accumulators in registers
    (a few rows may go to the stack under its register cap; its accumulators must not)."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    from tools.compile_check import H100_SHARED, PTX_OF, compile_sym2, loop_op_counts
    built = compile_sym2(64)
    out = {name: (shared, stack) for name, shared, _, stack in built}
    assert {"_sym2_outer_keys", "_sym2_outer", "_sym2_query_fwd_rows", "_sym2_query_bwd", "_sym2_key_bwd",
            "_sym2_key_dv_rows"} <= set(out)
    for name, (shared, _) in out.items():
        assert shared <= H100_SHARED, name
    # the row-scaled query forward runs capped at 128 registers (4 programs per SM, 15% faster on the H100 than its
    # 150 uncapped): the cap must reach the build, and what it pushes to the stack stay a few rows, not its accumulators
    regs = {name: r for name, _, r, _ in built}
    assert regs["_sym2_query_fwd_rows"] in (None, 128), regs
    stack = out["_sym2_query_fwd_rows"][1]
    assert stack is None or stack <= 256, f"_sym2_query_fwd_rows spills {stack} bytes"
    # the state outer products reduce their normalizer sums after the loop, not per step: a row sum per step cost
    # ~80 lane shuffles per step and half their speed on the H200 (docs/kernels.md)
    for name in ("_sym2_outer_keys", "_sym2_outer"):
        loops = loop_op_counts(PTX_OF[name])
        assert loops and all(loop["shfl.sync"] == 0 for loop in loops), (name, loops)
    # the Gluon outer products (the CUDA default, gluon_outer.py) build here too, with Triton's Gluon API of this
    # machine, and keep everything in registers
    from longctx.kernels.power.chunk_p2.kernels import gluon_available
    assert gluon_available()        # what a CUDA launch on this Triton checks before taking the Gluon kernel
    for name in ("gluon_outer_keys", "gluon_outer"):
        assert out[name][1] in (None, 0), f"{name} spills {out[name][1]} bytes"
    # the row kernels run under register caps (config *_regs: more programs per SM pay despite a few spilled rows;
    # at d=64 Triton 3.6 spills 32 / 160 / 0 / 56 bytes in the query forward / query backward / key dv / key dk, 3.9
    # 0 / 104 / 0 / 56): the caps reach the build, and what they push to the stack stays a few rows, not the
    # accumulators
    from longctx.kernels.power.chunk_p2 import kernels as s2
    regs = {name: r for name, _, r, _ in built}
    kinds = {"gluon_query_fwd_rows": "qfwd", "gluon_query_bwd_rows": "qbwd", "gluon_key_dv_rows": "kdv",
             "gluon_key_dk_rows": "kdk"}
    for name, kind in kinds.items():
        cap = s2.gluon_rows_regs(kind).get("maxnreg", 255)
        assert regs[name] is None or regs[name] <= cap, (name, regs[name], cap)
        assert out[name][1] in (None, 0) or out[name][1] <= 512, f"{name} spills {out[name][1]} bytes"
    # every Gluon row kernel keeps one accumulating matmul in flight and drains the pipe once per first tile: a
    # loop-carried in-flight accumulator made ptxas serialize every matmul (C7515: a full wait per HGMMA)
    from tools.compile_check import wgmma_waits
    for name in kinds:
        waits = wgmma_waits(sass_of(name))
        assert waits["full_waits"] * 4 < waits["hgmma"], (name, waits)
    # the slice loops as sass_loop_counts sees them, whose matmuls are the closed form TW slices x (contraction / 16)
    # HGMMA: the forward-type kernels one loop per window level, contracting the window (window_min = 16: windows
    # 64 / 32 / 16 columns, 8 x w/16), the backward-type one loop over every first tile, contracting d (8 x 64/16)
    from tools.compile_check import sass_loop_counts
    fwd = [8 * (64 >> lv) // 16 for lv in range(3 if s2.gluon_window_min(64) == 16 else 2)]
    expect = {"gluon_query_fwd_rows": fwd, "gluon_key_dv_rows": fwd, "gluon_query_bwd_rows": [32],
              "gluon_key_dk_rows": [32]}
    for name, hgmma in expect.items():
        loops = sass_loop_counts(sass_of(name))
        assert [loop["ops"].get("HGMMA", 0) for loop in loops] == hgmma, (name, loops)
        assert all(loop["instructions"] > loop["ops"]["HGMMA"] for loop in loops), name


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
@pytest.mark.parametrize("d", [32])
def test_gluon_backward_over_the_symmetric_completion_builds(d):
    """The Gluon query backward and key dk over the state's symmetric completion build with their tiles (128 rows,
    8 warps, 8 slots, capped at 128 registers) at d = 32, as test_sym2_kernels_compile_for_sm90 checks them at d = 64:
    one slice loop over every first tile whose matmuls are 8 slices x d / 16 HGMMA, kept in flight (not serialized
    by ptxas: C7514, which the own tile's accumulator rescale caused where it stood at a tile's end), a few rows on
    the stack at most."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    from longctx.kernels.power.chunk_p2 import kernels as s2
    from tools.compile_check import compile_gluon_rows, sass_loop_counts, wgmma_waits
    if not s2.gluon_available():
        pytest.skip("this Triton has no Gluon")
    built = {name: (regs, stack) for name, _, regs, stack in compile_gluon_rows(d)}
    for name in ("gluon_query_bwd_rows", "gluon_key_dk_rows"):
        regs, stack = built[name]
        assert (regs is None or regs <= 128) and (stack in (None, 0) or stack <= 512), (name, regs, stack)
        loops = sass_loop_counts(sass_of(name))
        assert [loop["ops"].get("HGMMA", 0) for loop in loops] == [8 * d // 16], (name, loops)
        waits = wgmma_waits(sass_of(name))
        assert waits["full_waits"] * 4 < waits["hgmma"], (name, waits)


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
def test_gluon_rows_window_levels():
    """config window_min = 16 at d=64: the forward-type kernels' slice windows halve 64 -> 32 -> 16 columns, each
    level serving the first tiles whose features (i, j >= tile(i)) it covers (0-3, 4-5, 6-7 of 8): one slice loop per
    level, whose HGMMA count is the closed form 8 slices x window / 16 (32, 16, 8). An invalid minimum falls back to
    the two windows."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    from longctx.kernels.power.chunk_p2 import config as p2_config, gluon_rows
    from longctx.kernels.power.chunk_p2 import kernels as s2
    from tools.compile_check import compile_gluon_rows, sass_loop_counts
    if not s2.gluon_available():
        pytest.skip("this Triton has no Gluon")
    levels, tiles = (getattr(f, "fn", f) for f in (gluon_rows._levels, gluon_rows._level_tiles))
    assert levels(16, 64) == 3 and [tiles(lv, 16, 64, 8) for lv in range(3)] == [(0, 4), (4, 6), (6, 8)]
    assert levels(32, 64) == 2 and [tiles(lv, 32, 64, 8) for lv in range(2)] == [(0, 4), (4, 8)]
    assert levels(16, 32) == 2 and [tiles(lv, 16, 32, 8) for lv in range(2)] == [(0, 2), (2, 4)]
    for w, d, expect in ((16, 64, 16), (0, 64, 32), (24, 64, 32), (64, 64, 32), (16, 32, 16)):
        with p2_config.override(window_min=w):
            assert s2.gluon_window_min(d) == expect, (w, d)
    with p2_config.override(window_min=0):
        built = {name: stack for name, _, _, stack in compile_gluon_rows(64)}
    expect = {"gluon_query_fwd_rows": [32, 16], "gluon_key_dv_rows": [32, 16]}
    for name, hgmma in expect.items():
        assert built[name] in (None, 0) or built[name] <= 512, (name, built[name])
        loops = sass_loop_counts(sass_of(name))
        assert [loop["ops"].get("HGMMA", 0) for loop in loops] == hgmma, (name, loops)


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
@pytest.mark.parametrize("block", ["qbwd_block", "qfwd_block"])
def test_gluon_rows_refuse_a_ring_too_short_to_pipeline(block):
    """A 2-slot cp.async ring would issue a slice's copy into the slot its matmul reads next, with no wait between
    (such a build once timed 2% faster): the row kernels' passes refuse to build with fewer than 3 slots."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    from longctx.kernels.power.chunk_p2 import config as p2_config
    from longctx.kernels.power.chunk_p2 import kernels as s2
    from tools.compile_check import compile_gluon_rows
    if not s2.gluon_available():
        pytest.skip("this Triton has no Gluon")
    with pytest.raises(Exception) as err, p2_config.override(**{block: (64, 4, 2)}):
        compile_gluon_rows(32)
    chain, e = [], err.value
    while e is not None:                    # the assertion's message sits in the compiler error's chain
        chain.append(str(e))
        e = e.__cause__ or e.__context__
    assert any("landing" in text for text in chain), chain      # _sym_pass / _fwd_pass: "... one landing ..."


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
def test_gluon_outer_drain_reaches_the_step_loop():
    """The step drain (it closed the normalizer race of one block per group): every Gluon outer-product kernel's step
    loop waits for all its matmuls (WARPGROUP.DEPBAR.LE gsb0, 0x0) before the loads that write the next step's
    operand registers, and the builds keep everything in registers."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    from longctx.kernels.power.chunk_p2 import kernels as s2
    from tools.compile_check import compile_gluon_outer, sass_instructions
    if not s2.gluon_available():
        pytest.skip("this Triton has no Gluon")
    names = ("gluon_outer_keys", "gluon_outer")
    built = {name: stack for name, _, _, stack in compile_gluon_outer(64)}
    for name in names:
        assert built[name] in (None, 0), (name, built[name])
        ins = [text for _, text in sass_instructions(sass_of(name))]
        loads = [i for i, text in enumerate(ins) if text.startswith("LDSM")]   # a step's operand loads
        assert any(any("WARPGROUP.DEPBAR.LE gsb0, 0x0" in text for text in ins[i - 6:i]) for i in loads), name
