"""Compile the power-attention kernels for an NVIDIA target on a machine without a GPU (Triton's
nvidia backend + the bundled ptxas), and print shared memory, registers and spill stack per kernel. Catches what
TRITON_INTERPRET=1 accepts but the compiler rejects, and shared-memory overflows, before any device time.

    python tools/compile_check.py 2,64,bf16 4,64,fp32      # p,d,dtype ...
    python tools/compile_check.py sym2,64                  # the p=2 kernels (the tunables table's sym2_* rows)
    python tools/compile_check.py attn,2,64,bf16           # the attention form (p,d,dtype)
    python tools/compile_check.py intra,2,64,bf16          # its kernels as the chunked form's intra-chunk attention
    python tools/compile_check.py decode,2,64,bf16         # the fused decoding step (p,d,dtype of q/k/v; fp32 state)
    python tools/compile_check.py --ptx DIR 2,64,bf16 sym2,64   # also write each kernel's PTX
    python tools/compile_check.py --loops sym2,64 attn,2,64,bf16  # + instruction mix per loop

--ptx writes DIR/<case>_<kernel>_<i>.ptx without line info and label names: run it on two trees and diff the
folders (`diff -r`) to show that a refactor of the kernel sources compiles to the same code.
--loops also prints, per kernel, the instruction mix of each loop body of its PTX (`loop_op_counts`): what a step
of the main loop costs besides its matmuls (lane shuffles, barriers, shared-memory round trips, global loads), and
for the attention kernels each loop's SASS instruction count and top opcodes (`sass_loop_counts`, where cuobjdump is
bundled): the issue slots a step takes. That view found several of the largest wins; read it before sweeping blocks.
"""
from __future__ import annotations

import collections
import inspect
import math
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from longctx.kernels.power import chunk as tc
from longctx.kernels.power import chunk_stages
from longctx.kernels.power import config as power_config
from longctx.kernels.power import decode_kernel as dk
from longctx.kernels.power import parallel as ta
from longctx.kernels.power import tunables
from longctx.kernels.power.kernel_index import jit
from longctx.kernels.power.chunk_p2 import config as p2cfg
from longctx.kernels.power.chunk_p2 import kernels as s2

SYM2_KERNELS = ("outer", "qbwd", "kbwd", "qfwd_rows", "kdv_rows", "qbwd_rows")   # chunk_p2.kernels.block_entry's
H100_SHARED = 232448        # bytes of shared memory a block may use on sm_90


LOOP_OPS = ("wgmma.mma_async", "shfl.sync", "bar.sync", "ld.shared", "st.shared", "ld.global", "st.global",
            "cvt.rn.bf16x2.f32", "fma.rn.f32", "mul.f32", "add.f32", "ex2")
PTX_OF: dict = {}     # kernel name (as the compile_* functions report it) -> PTX of its last build
PTX_DIR = None        # --ptx: where _compile writes each kernel's normalized PTX (PTX_TAG names the case)
PTX_TAG = ""
_PTX_COUNT: dict = {}


def _normalized_ptx(ptx: str) -> str:
    """PTX without the debug sections, .loc/.file lines, comments and label names (they move with source lines)."""
    ptx = re.sub(r"\.section\s+\.debug.*", "", ptx, flags=re.S)
    keep = [line for line in ptx.splitlines() if not re.match(r"\s*(\.loc|\.file|//|\$L__)", line)]
    return re.sub(r"\$L__[A-Za-z_]+\d+", "", "\n".join(keep))


def _compile(fn, ptr_types, scalars, consts, warps, stages, arch, maxnreg=None, source=ASTSource):
    params = inspect.signature(fn.fn).parameters
    names = list(params)
    # constexpr switches left at their defaults compile as those defaults, as a launch that does not pass them
    consts = dict({n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty
                   and "constexpr" in str(p.annotation)}, **consts)
    sig = {n: "constexpr" if n in consts else scalars.get(n, ptr_types.get(n, "*fp32")) for n in names}
    # what a launch on real tensors sees: 16-byte aligned pointers and T % 16 == 0 (the benchmark lengths). Without
    # these hints the compiler cannot vectorize the bf16 loads and does not pipeline them (cp.async), so
    # registers and spills came out unlike the device's
    aligned = [n for n in names if sig[n].startswith("*") or n == "T"]
    src = source(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                 attrs={(names.index(n),): [["tt.divisibility", 16]] for n in aligned})
    kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                            options=dict(num_warps=warps, num_stages=stages, maxnreg=maxnreg))
    if PTX_DIR:
        key = f"{PTX_TAG}_{kernel.name}"
        i = _PTX_COUNT[key] = _PTX_COUNT.get(key, -1) + 1
        with open(os.path.join(PTX_DIR, f"{key}_{i}.ptx"), "w") as fh:
            fh.write(_normalized_ptx(kernel.asm["ptx"]))
    return kernel


def loop_op_counts(ptx: str, ops=LOOP_OPS) -> list[dict]:
    """For each loop of a PTX listing (a label with a later branch back to it; nested loops appear as their own
    entries), the count of each op in its body and the body's length in lines."""
    lines = ptx.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"\s*(\$L__\w+):", line))}
    out = []
    for i, line in enumerate(lines):
        m = re.search(r"\bbra(?:\.uni)?\s+(\$L__\w+);", line)
        if m and labels.get(m.group(1), i) < i:
            body = "\n".join(lines[labels[m.group(1)]:i + 1])
            counts = {op: len(re.findall(r"\b" + re.escape(op), body)) for op in ops}
            out.append(counts | {"lines": i + 1 - labels[m.group(1)]})
    return out


def sass_instructions(sass: str) -> list[tuple[int, str]]:
    """(address, text) of each instruction of a SASS listing (cuobjdump -sass)."""
    return [(int(m.group(1), 16), m.group(2).strip()) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]


def sass_opcode(text: str) -> str:
    """The opcode of one SASS instruction without its guard predicate and modifiers ('@!P0 LDGSTS.E.128 [..]' ->
    'LDGSTS')."""
    words = re.sub(r"^@!?U?P\w+\s+", "", text.strip()).split()
    return words[0].split(".")[0] if words else ""


def sass_loop_counts(sass: str) -> list[dict]:
    """For each loop of a SASS listing (cuobjdump -sass: a branch back to an earlier address), its instruction count
    and the count of each opcode (guard predicates and modifiers dropped), outermost and inner loops alike. What a
    slice loop issues per iteration is the row kernels' cost where the tensor cores wait on the issue slots."""
    ins = sass_instructions(sass)
    index = {addr: i for i, (addr, _) in enumerate(ins)}
    out = []
    for i, (addr, text) in enumerate(ins):
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", text)
        target = int(m.group(1), 16) if m else None
        if target is not None and target < addr and target in index:
            body = [t for _, t in ins[index[target]:i + 1]]
            ops = collections.Counter(sass_opcode(t) for t in body)
            out.append({"start": target, "end": addr, "instructions": len(body), "ops": dict(ops)})
    return out


def _cuobjdump(kernel, *args):
    """cuobjdump's output on the kernel's cubin, or None if it is not bundled."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        return subprocess.run([tool, *args, f.name], capture_output=True, text=True).stdout


def _usage(kernel):
    """(registers, spill stack bytes) from cuobjdump, or (None, None) if it is not bundled."""
    m = re.search(r"REG:(\d+).*?STACK:(\d+)", _cuobjdump(kernel, "-res-usage") or "")
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


SASS_OF: dict = {}    # the Gluon kernels' SASS (compile_gluon_rows, compile_gluon_outer), when cuobjdump is bundled


def wgmma_waits(sass: str) -> dict:
    """Counts in SASS of the tensor-core matmuls (HGMMA) and of the waits that drain them all (gsb0 to 0): ptxas
    serializes an async pipeline it cannot prove safe (C7514 / C7515), which shows as a full wait per matmul."""
    return {"hgmma": sass.count("HGMMA."), "full_waits": sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x0")}


def compile_chunked(p, d, dtype, *, norm=True, gated=True, hq=4, hk=2, chunk=1024, arch=90):
    """Compile the chunked-form kernels for one (p, d, dtype in
    {'bf16','fp16','fp32'}); returns [(name, shared bytes, registers, spill stack bytes)]."""
    tile = tc.state_tile(p, d)
    F = tile ** p
    torch_dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    sdt, prec = chunk_stages.state_operands(torch_dt)
    rows, BD, warps, stages = tunables.TABLE[tc.state_tile_key(p, d, torch_dt)]
    io = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}[dtype]
    base = dict(D=d, P=p, TILE=tile, F=F, C=chunk, GATED=gated, DOT_DT=sdt, PREC=prec)
    ints = {n: "i32" for n in ("T", "NC", "DS", "L", "NU", "M")} | {"scale_p": "fp32"}
    jobs = [
        (jit("chunk_query_fwd"), {"Q": io, "IDX": "*i32", "Y": io},
         dict(base, HQ=hq, HK=hk, BM=rows, NORM=norm, HAS_S0=True)),
        (jit("chunk_query_bwd"), {"Q": io, "IDX": "*i32", "DO": io},
         dict(base, HQ=hq, HK=hk, BM=rows, NORM=norm, HAS_S0=True)),
        (jit("chunk_update_bwd"), {"K": io, "V": io, "IDX": "*i32"}, dict(base, HK=hk, BK=rows)),
        (jit("chunk_update_fwd"), {"K": io, "V": io, "IDX": "*i32"}, dict(base, HK=hk, BK=rows, BD=BD)),
        (jit("chunk_query_grad"), {"Q": io, "IDX": "*i32", "DO": io},
         dict(base, HQ=hq, HK=hk, BM=rows, BD=BD, NORM=norm)),
    ]
    scan = dict(HK=hk, C=chunk, BLOCK=power_config.chunk.current().discumsum_block, GATED=gated)
    jobs_scan = [(jit("discumsum"), {}, dict(scan, REVERSE=False)),
                 (jit("discumsum"), {}, dict(scan, REVERSE=True))]
    out = []
    for fn, ptrs, consts in jobs:
        k = _compile(fn, ptrs, ints, consts, warps, stages, arch)
        out.append((k.name, k.metadata.shared, *_usage(k)))
    for fn, ptrs, consts in jobs_scan:
        k = _compile(fn, ptrs, ints, consts, 4, 1, arch)
        out.append((k.name + ("_rev" if consts["REVERSE"] else "_fwd"), k.metadata.shared, *_usage(k)))
    return out


def compile_attention(p, d, dtype, *, norm=True, gated=True, hq=4, hk=2, arch=90, xt=False, t=None):
    """Compile the attention-form kernels (forward, the two backward kernels) for one (p, d, dtype) with the blocks
    and operand types AttentionForm uses; returns [(name, shared bytes, registers, spill stack bytes)]. xt: as the
    chunked form launches them with the Gluon outer products' scaled copies (forward XT_MODE 1, dq XT_MODE 2), on
    chunks of config.dispatch's chunk_p2 rows; t: the attention form's sequence length (None: one that is not whole
    tiles, masks kept)."""
    torch_dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    io = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}[dtype]
    ints = {"scale": "fp32", "scale_p": "fp32", "T": "i32"}
    base = dict(HQ=hq, HK=hk, D=d, P=p, NORM=norm, GATED=gated)
    out = []
    for fn, kernel, ptrs in ((jit("attn_fwd"), "fwd", {"Q": io, "K": io, "V": io, "O": io}),
                             (jit("attn_dkdv"), "dkdv", {"Q": io, "K": io, "V": io, "DO": io}),
                             (jit("attn_dq"), "dq", {"Q": io, "K": io, "V": io, "DO": io, "O": io})):
        cfg = ta.launch_config(d, kernel, *ta.dot_dtype(torch_dt, norm, kernel != "fwd"), chunked=xt,
                               t=power_config.dispatch.current().chunk_p2 if xt else t)
        warps, stages, reg = cfg.pop("num_warps"), cfg.pop("num_stages"), cfg.pop("maxnreg", None)
        if kernel == "dq":
            cfg["DELTA_OUT"] = norm         # as launched: it forms Delta = dy . y itself
        if kernel != "fwd":
            cfg.update(ta.backward_rounding(gated, cfg["DOT_DT"]))   # as attention_backward launches them
            if xt:      # the chunked form's intra-chunk attention keeps separate roundings
                cfg["SHARED_ROUND"] = False
        if kernel == "dkdv" and not xt and ta.fused_backward():      # the one-kernel backward: dq by atomics,
            # by bulk tensor reductions where the target has TMA
            cfg.update(ATOMIC_DQ=True, TMA_DQ=arch >= 90 and power_config.attention.current().tma_dq)
        scalars = ints
        if xt and kernel != "dkdv":
            cfg["XT_MODE"] = 1 if kernel == "fwd" else 2
            ptrs = dict(ptrs, XT=io, W=io)
            scalars = dict(ints, CB0="i32", NCH="i32", T_FULL="i32", sqrt_scale_p="fp32")
        k = _compile(fn, ptrs, scalars, dict(base, **cfg), warps, stages, arch, reg)
        out.append((k.name, k.metadata.shared, *_usage(k)))
        PTX_OF[k.name] = k.asm["ptx"]
        SASS_OF[k.name] = _cuobjdump(k, "-sass")
    for reverse in (False, True):       # the gate scan both forms run first (gates.py), and its backward (which
        # also sums the GQA group's query-side gate gradients)
        k = _compile(jit("segment_cumsum"), {"X": "*fp32", "X2": "*fp32", "Y": "*fp32"}, {"T": "i32", "SEG": "i32"},
                     dict(H=hk, BT=power_config.gates.current().column_tile, REVERSE=reverse,
                          REP=hq // hk if reverse else 0), 4, 3, arch)
        out.append((k.name + ("_rev" if reverse else ""), k.metadata.shared, *_usage(k)))
    return out


def compile_sym2(d, *, norm=True, gated=True, hq=4, hk=2, chunk=1024, arch=90, blocks=None):
    """Compile the p=2 kernels (chunk_p2/kernels.py, bf16) with `blocks` (default chunk_p2.kernels.block_entry);
    returns [(name, shared bytes, registers, spill stack bytes)]."""
    ints = {n: "i32" for n in ("T", "NC", "DS", "NG", "NU", "SLOT")} | {"scale_p": "fp32"}
    cfg = p2cfg.current()
    base = dict(D=d, C=chunk, TW=s2.TILE2, GATED=gated, DOT_DT=tl.bfloat16, PREC="tf32")
    query = dict(base, HQ=hq, HK=hk, NORM=norm, HAS_S0=True)
    rows_kw = dict(KW2=s2.half_window(d))
    atomic = s2.atomic_updates()           # the backward kernels' dq / dk updates, as a launch would pick them
    jobs = [
        # (OUT: the per-chunk states and their gradients are bf16 for bf16 inputs)
        ("outer", jit("sym2_outer"), {"X": "*bf16", "Y": "*bf16", "GRP": "*i32", "OUT": "*bf16"},
         dict(base, HX=hk, HK=hk, KEYS=True, NORM=norm), "BK"),
        ("outer", jit("sym2_outer"), {"X": "*bf16", "Y": "*bf16", "GRP": "*i32", "OUT": "*bf16"},
         dict(base, HX=hq, HK=hk, KEYS=False, NORM=norm), "BK"),
        ("qbwd", jit("sym2_qbwd"), {"Q": "*bf16", "GRP": "*i32", "DO": "*bf16", "DQO": "*bf16"},
         dict(query, ATOMIC=atomic, CAST=True), "BM"),
        ("qfwd_rows", jit("sym2_qfwd_rows"), {"Q": "*bf16", "S": "*bf16", "Y": "*bf16"},
         query | rows_kw | dict(PIPE=cfg.qfwd_pipe), "BM"),
        ("kbwd", jit("sym2_kbwd"), {"K": "*bf16", "V": "*bf16", "GRP": "*i32", "DKO": "*bf16"},
         dict(base, HK=hk, ATOMIC=atomic, CAST=True), "BK"),
        ("qbwd_rows", jit("sym2_qbwd_rows"), {"Q": "*bf16", "S": "*bf16", "DO": "*bf16", "DQO": "*bf16"},
         dict(query, ATOMIC=atomic, CAST=True) | rows_kw | dict(PIPE=cfg.qbwd_pipe), "BM"),
        ("kdv_rows", jit("sym2_kdv_rows"), {"K": "*bf16", "DU": "*bf16", "DV": "*bf16"},
         dict(base, HK=hk) | rows_kw | dict(PIPE=cfg.kdv_pipe), "BK"),
    ]
    out = []
    for key, fn, ptrs, consts, rows_name in jobs:
        entry = (blocks or {}).get(key) or s2.block_entry(key, d)
        jg, rows = entry[:2]
        opts = ta.launch_options(entry)
        if "JG" in inspect.signature(fn.fn).parameters:
            consts = dict(consts, JG=jg)
        k = _compile(fn, ptrs, ints, dict(consts, **{rows_name: rows}), opts["num_warps"], opts["num_stages"], arch,
                     opts.get("maxnreg"))
        name = f"{k.name}{'_keys' if consts.get('KEYS') else ''}"
        out.append((name, k.metadata.shared, *_usage(k)))
        PTX_OF[name] = k.asm["ptx"]
    if d in p2cfg.GLUON_OUTER_DIMS:
        out += compile_gluon_outer(d, norm=norm, hq=hq, hk=hk, chunk=chunk, arch=arch)
    if d in (32, 64):
        out += compile_gluon_rows(d, norm=norm, hq=hq, hk=hk, chunk=chunk, arch=arch)
    return out


def compile_gluon_rows(d, *, norm=True, hq=4, hk=2, chunk=1024, arch=90):
    """The row kernels in Gluon (gluon_rows.gluon_query_fwd_rows / gluon_query_bwd_rows / gluon_key_dv_rows /
    gluon_key_dk_rows) as they would launch with the current chunk_p2 config, register caps included:
    [(name, shared, registers, stack)]."""
    from triton.experimental.gluon._runtime import GluonASTSource

    query_ints = {n: "i32" for n in ("T", "NC", "DS")} | {"scale_p": "fp32"}
    key_ints = {n: "i32" for n in ("T", "NC", "DS", "NU")}
    shape = dict(D=d, C=chunk, TW=s2.TILE2, GATED=True)
    queries = dict(shape, HQ=hq, HK=hk, NORM=norm, HAS_S0=False)
    cfg = p2cfg.current()
    low, zt = "*bf16", "*fp32"          # the intra-chunk dq / dk they finish (bf16); the packed normalizer
    out = []
    for fn, kind, block, ptrs, ints, consts in (
            (jit("gluon_query_fwd_rows"), "qfwd", cfg.qfwd_block,
             {"Q": "*bf16", "S": "*bf16", "OI": "*bf16", "Y": "*bf16", "Z": zt}, query_ints,
             dict(queries)),
            (jit("gluon_query_bwd_rows"), "qbwd", cfg.qbwd_block,
             {"Q": "*bf16", "S": "*bf16", "DO": "*bf16", "DQO": "*bf16", "DQ": low, "Z": zt}, query_ints,
             dict(queries, CAST=True)),
            (jit("gluon_key_dv_rows"), "kdv", cfg.kdv_block, {"K": "*bf16", "DU": "*bf16", "DV": "*bf16"},
             key_ints, dict(shape, HK=hk, DU_MULT=True)),
            (jit("gluon_key_dk_rows"), "kdk", cfg.kdk_block,
             {"K": "*bf16", "V": "*bf16", "DU": "*bf16", "DKO": "*bf16", "DK": low, "DUZ": zt},
             key_ints, dict(shape, HK=hk, CAST=True, DU_MULT=True))):
        rows, warps, nbuf = block
        consts = dict(consts, NBUF=nbuf, **({"MINW": s2.gluon_window_min(d)} if kind in ("qfwd", "kdv") else {}),
                      **({"BM": rows} if kind.startswith("q") else {"BK": rows}))
        k = _compile(fn, ptrs, ints, consts, warps, 1, arch, s2.gluon_rows_regs(kind).get("maxnreg"),
                     source=GluonASTSource)
        name = fn.fn.__name__
        PTX_OF[name] = k.asm["ptx"]
        SASS_OF[name] = _cuobjdump(k, "-sass")
        out.append((name, k.metadata.shared, *_usage(k)))
    return out


def compile_gluon_outer(d, *, norm=True, hq=4, hk=2, chunk=1024, arch=90):
    """The outer products in Gluon (gluon_outer.gluon_outer, keys and query side, scanning as launch_outer runs them),
    the plain transposed copies Triton's sym2_outer reads (transpose_heads) and the normalizer's scan:
    [(name, shared, registers, stack)]."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from longctx.kernels.power.chunk_p2.gluon_outer import operand_layout_3d
    cfg = p2cfg.current()
    jg, bk = s2.gluon_outer_block(d, chunk)
    ints = {n: "i32" for n in ("T", "NC", "DS", "SLOT")} | {"sqrt_scale_p": "fp32"}
    out = []
    for keys in (True, False):
        consts = dict(HX=hk if keys else hq, HK=hk, D=d, C=chunk, TW=s2.TILE2, JG=jg, BK=bk, KEYS=keys, NORM=norm,
                      NBUF=cfg.outer_stages, L3=operand_layout_3d(s2.TILE2, s2.TILE2 * jg, bk), GATED=True,
                      DU_MULT=not keys)
        k = _compile(jit("gluon_outer"), {"X": "*bf16", "Y": "*bf16", "W": "*bf16", "GRP": "*i32", "GROWS": "*i32",
                                   "OUT": "*bf16", "SF": "*bf16"}, ints, consts, 4, 1, arch,
                     maxnreg=cfg.outer_scan_regs or None, source=GluonASTSource)
        name = f"gluon_outer{'_keys' if keys else ''}"
        out.append((name, k.metadata.shared, *_usage(k)))
        PTX_OF[name] = k.asm["ptx"]
        SASS_OF[name] = _cuobjdump(k, "-sass")
        bt, warps = cfg.transpose_block
        k = _compile(jit("transpose_heads"), {"X": "*bf16", "XT": "*bf16"}, ints, dict(H=hk if keys else hq, D=d, BT=bt),
                     warps, 1, arch)
        out.append((f"_transpose_heads{'_keys' if keys else ''}", k.metadata.shared, *_usage(k)))
        # the normalizer apart (kernels.launch_norm_scan)
        k = _compile(jit("norm_chunk_sums"), {"X": "*bf16", "W": "*bf16", "ZC": "*fp32"}, ints,
                     dict(HX=hk if keys else hq, HK=hk, D=d, C=chunk, BK=cfg.norm_sums_bk, WEIGHTED=not keys,
                          CPP=s2.norm_sums_chunks(chunk, 65536 // chunk)),
                     *s2.norm_sums_options(d).values(), arch)
        out.append((f"_norm_chunk_sums{'_keys' if keys else ''}", k.metadata.shared, *_usage(k)))
        bi = s2.norm_scan_rows(d)
        k = _compile(jit("norm_scan"), {"ZC": "*fp32", "G": "*fp32", "OUTZ": "*fp32", "ZF": "*fp32", "DGT": "*fp32"},
                     ints, dict(HK=hk, D=d, C=chunk, NT=d // s2.TILE2, TW=s2.TILE2, BI=bi, KEYS=keys, GATED=True,
                                DU_MULT=not keys, SUMS=True, AHEAD=cfg.norm_scan_ahead), 4, 3,
                     arch)
        out.append((f"_norm_scan{'_keys' if keys else ''}", k.metadata.shared, *_usage(k)))
    return out


def compile_decode(p, d, dtype, *, rep=1, gated=True, arch=90, heads=12, sms=132, **knobs):
    """Compile the fused decoding step (decode_kernel.py) at (p, d, dtype of q/k/v/y; fp32 state) as a batch-1 launch
    with `heads` key heads on `sms` SMs splits it, and as one program per head (SPLIT=1); normalized for even p and
    gated by the gate's input (GATED=2), as the model runs it; knobs: its tuning constants (SPLIT_CHUNK=16,
    STATE_FIRST=True). Returns [(name, shared bytes, registers, spill stack bytes)]."""
    io = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}[dtype]
    ptrs = {"S": "*fp32", "Z": "*fp32", "IDX": "*i32", "W": "*fp32", "Q": io, "K": io, "V": io, "LOG_G": "*fp32",
            "Y": io, "PART_N": "*fp32", "PART_D": "*fp32", "TICKET": "*i32", "GX": "*fp32", "GW": "*fp32",
            "GB": "*fp32"}
    scalars = {n: "i32" for n in ("stride_qb", "stride_qh", "stride_kb", "stride_kh", "stride_vb", "stride_vh",
                                  "stride_gb", "stride_gh", "stride_yb", "stride_yh", "stride_xb", "B", "HK", "D",
                                  "DX", "BLOCKS_PER_SPLIT")}
    scalars["scale"] = "fp32"
    split = dk.split_for(tc.state_dim(p, d), d, heads, sms, dk.block_rows(d, rep))[0]
    out = []
    for n_split in sorted({split, 1}, reverse=True):
        consts = dict(P=p, REP=rep, REP_P2=1 << (rep - 1).bit_length(), DV=d, BLOCK_D=dk.block_rows(d, rep),
                      SPLIT=n_split,
                      GATED=2 if gated else 0, NORM=p % 2 == 0, EPS_=dk.EPS, DEN_FLOOR=math.exp(dk.M_FLOOR),
                      **knobs)
        k = _compile(jit("decode_step"), ptrs, scalars, consts, dk.NUM_WARPS, 1, arch)
        out.append((f"{k.name}_p{p}_split{n_split}", k.metadata.shared, *_usage(k)))
    return out


def _print_loops(name):
    for loop in loop_op_counts(PTX_OF.get(name, "")):
        print("      loop: " + " ".join(f"{op}={n}" for op, n in loop.items() if n), flush=True)
    _print_sass_loops(name)


def _print_sass_loops(name):
    for loop in sass_loop_counts(SASS_OF.get(name) or ""):
        top = sorted(loop["ops"].items(), key=lambda kv: -kv[1])[:6]
        print(f"    loop {loop['start']:#x}: {loop['instructions']} instructions, "
              + ", ".join(f"{k} {v}" for k, v in top), flush=True)


def main(argv):
    global PTX_DIR, PTX_TAG
    if {"-h", "--help"} & set(argv):
        print(f"usage: python tools/compile_check.py [--ptx DIR] [--loops] [CASE ...]\n\n{__doc__}")
        return
    loops = "--loops" in argv
    argv = [a for a in argv if a != "--loops"]
    if argv[:1] == ["--ptx"]:
        PTX_DIR, argv = argv[1], argv[2:]
        os.makedirs(PTX_DIR, exist_ok=True)
    for case in argv or ["2,64,bf16"]:
        PTX_TAG = case.replace(",", "-")
        if case.startswith("sym2"):
            d = int(case.split(",")[1])
            print(f"sym2 d={d} {({k: s2.block_entry(k, d) for k in SYM2_KERNELS})}", flush=True)
            for name, shared, regs, stack in compile_sym2(d):
                print(f"  {name:20s} shared={shared:7d} regs={regs} spill_stack={stack}", flush=True)
                if loops:
                    _print_loops(name)
            continue
        if case.startswith("gluon"):     # the Gluon kernels with their loops' instruction counts (SASS)
            d = int(case.split(",")[1])
            print(f"gluon kernels d={d}", flush=True)
            for name, shared, regs, stack in compile_gluon_rows(d) + compile_gluon_outer(d):
                print(f"  {name:22s} shared={shared:7d} regs={regs} spill_stack={stack}", flush=True)
                _print_sass_loops(name)
            continue
        if case.startswith("decode"):
            _, p, d, dtype = case.split(",")
            print(f"fused decoding step p={p} d={d} {dtype} (fp32 state)", flush=True)
            for name, shared, regs, stack in compile_decode(int(p), int(d), dtype):
                print(f"  {name:34s} shared={shared:7d} regs={regs} spill_stack={stack}", flush=True)
            continue
        if case.startswith(("attn", "intra")):
            form, p, d, dtype = case.split(",")
            xt = form == "intra"
            title = f"intra-chunk attention (chunks of {power_config.dispatch.current().chunk_p2})" if xt else \
                "attention form"
            print(f"{title} p={p} d={d} {dtype}", flush=True)
            for name, shared, regs, stack in compile_attention(int(p), int(d), dtype, xt=xt):
                print(f"  {name:20s} shared={shared:7d} regs={regs} spill_stack={stack}", flush=True)
                if loops:
                    _print_loops(name)
            continue
        p, d, dtype = case.split(",")
        print(f"p={p} d={d} {dtype}", flush=True)
        for name, shared, regs, stack in compile_chunked(int(p), int(d), dtype):
            flag = "  OVER sm_90 shared memory" if shared > H100_SHARED else ""
            print(f"  {name:20s} shared={shared:7d} regs={regs} spill_stack={stack}{flag}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
