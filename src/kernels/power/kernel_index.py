"""Every GPU kernel of power attention under one public name. The kernels live as private module attributes of the
files that launch them (parallel._attn_fwd, chunk_p2.kernels._sym2_outer, ...); plans, tools and profiles name them
here instead, so a kernel can move or be renamed in one place:

    jit("attn_fwd")                 the Triton (or Gluon) function, to compile or launch by hand
    profile_name("sym2_qbwd")       the name a CUDA profile or a compiled kernel reports ("_sym2_query_bwd")
    with stand_in({"attn_fwd": f}): every launch of attn_fwd runs f[grid](...) instead (host-cost measurements)

A name is the tunables table's kernel (tunables.KERNELS) where the kernel has one row family of its own; `tiles`
lists every table kernel whose rows a launch of it reads (the attention forward also reads its short-t and
intra-chunk rows, the generic state kernels the narrow or wide expanded tiles). Modules are imported on first use:
the Gluon kernels need a Triton with Gluon.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib


@dataclasses.dataclass(frozen=True)
class Kernel:
    module: str         # under longctx.kernels.power
    attr: str           # the module attribute the launches call
    tiles: tuple        # the tunables table kernels whose rows its launches read (empty: launch constants)
    what: str


_K = Kernel
INDEX: dict[str, Kernel] = {
    # attention form (parallel.py), also each chunk's own attention in the chunked forms
    "attn_fwd": _K("parallel", "_attn_fwd", ("attn_fwd", "attn_fwd_short", "intra_fwd"), "attention forward"),
    "attn_dkdv": _K("parallel", "_attn_bwd_dkdv", ("attn_dkdv", "attn_dkdv_offdiag_fp32"), "attention dk, dv"),
    "attn_dq": _K("parallel", "_attn_bwd_dq", ("attn_dq",), "attention dq"),
    "attn_bwd_prep": _K("parallel", "_attn_bwd_prep", (), "one-kernel backward: Delta, dq accumulator zeroed"),
    "attn_dq_finish": _K("parallel", "_attn_bwd_dq_finish", (), "one-kernel backward: dq cast, query gate terms"),
    "segment_cumsum": _K("gates", "_segment_cumsum", ("segment_cumsum",), "gate log-decay cumsums (and reverse)"),
    # generic chunked form (chunk.py, chunk_stages.py): expanded state tiles of F = tile^p features
    "chunk_update_fwd": _K("chunk", "_update_state_fwd", ("chunk_state", "chunk_state_wide"), "per-chunk states"),
    "chunk_query_fwd": _K("chunk", "_query_state_fwd", ("chunk_state", "chunk_state_wide"), "queries read states"),
    "chunk_query_grad": _K("chunk", "_query_grad_state", ("chunk_state", "chunk_state_wide"),
                           "per-chunk state gradients"),
    "chunk_query_bwd": _K("chunk", "_query_state_bwd", ("chunk_state", "chunk_state_wide"), "dq through the states"),
    "chunk_update_bwd": _K("chunk", "_update_state_bwd", ("chunk_state", "chunk_state_wide"),
                           "dk, dv through the states"),
    "discumsum": _K("chunk_stages", "_discumsum", ("discumsum",), "discounted scan over chunks (and reverse)"),
    # p = 2 state kernels, Triton (chunk_p2/kernels.py)
    "sym2_outer": _K("chunk_p2.kernels", "_sym2_outer", ("sym2_outer",), "symmetric outer products"),
    "sym2_qbwd": _K("chunk_p2.kernels", "_sym2_query_bwd", ("sym2_qbwd",), "query backward, grouped"),
    "sym2_kbwd": _K("chunk_p2.kernels", "_sym2_key_bwd", ("sym2_kbwd",), "key backward"),
    "sym2_qfwd_rows": _K("chunk_p2.kernels", "_sym2_query_fwd_rows", ("sym2_qfwd_rows",), "query forward, row-scaled"),
    "sym2_kdv_rows": _K("chunk_p2.kernels", "_sym2_key_dv_rows", ("sym2_kdv_rows",), "key dv, row-scaled"),
    "sym2_qbwd_rows": _K("chunk_p2.kernels", "_sym2_query_bwd_rows", ("sym2_qbwd_rows",), "query backward, row-scaled"),
    "transpose_heads": _K("chunk_p2.kernels", "_transpose_heads", ("transpose_heads",), "transposed copies"),
    "norm_chunk_sums": _K("chunk_p2.kernels", "_norm_chunk_sums", ("norm_chunk_sums",), "normalizer sums per chunk"),
    "norm_scan": _K("chunk_p2.kernels", "_norm_scan", ("norm_scan",), "normalizer scan over chunks"),
    # p = 2 state kernels, Gluon (chunk_p2/gluon_outer.py, gluon_rows.py)
    "gluon_outer": _K("chunk_p2.gluon_outer", "gluon_outer", ("gluon_outer",), "outer products scanning the chunks"),
    "gluon_query_fwd_rows": _K("chunk_p2.gluon_rows", "gluon_query_fwd_rows", ("gluon_query_fwd_rows",),
                               "query forward, row-scaled"),
    "gluon_query_bwd_rows": _K("chunk_p2.gluon_rows", "gluon_query_bwd_rows", ("gluon_query_bwd_rows",),
                               "query backward over the symmetric completion"),
    "gluon_key_dv_rows": _K("chunk_p2.gluon_rows", "gluon_key_dv_rows", ("gluon_key_dv_rows",), "key dv, row-scaled"),
    "gluon_key_dk_rows": _K("chunk_p2.gluon_rows", "gluon_key_dk_rows", ("gluon_key_dk_rows",),
                            "key dk over the symmetric completion"),
    # decoding (decode_kernel.py)
    "decode_step": _K("decode_kernel", "_power_decode_step", ("decode_step",), "one fused decoding step"),
}


def entry(name: str) -> Kernel:
    """The index entry of `name`; KeyError naming the known kernels."""
    if name not in INDEX:
        raise KeyError(f"kernel={name!r}: no such power-attention kernel; kernels: {sorted(INDEX)}")
    return INDEX[name]


def _module(name: str):
    return importlib.import_module(f"{__package__}.{entry(name).module}")


def jit(name: str):
    """The Triton / Gluon function the launches of `name` call (as they call it now: inside stand_in, the stand-in)."""
    return getattr(_module(name), entry(name).attr)


def profile_name(name: str) -> str:
    """The name of `name`'s compiled kernel, as CUDA profiles and compile reports print it."""
    return entry(name).attr


def of_profile(kernel: str):
    """The index name of a profiled kernel's name (profile_name's inverse), or None for a kernel not of this index."""
    return next((name for name, k in INDEX.items() if k.attr == kernel), None)


@contextlib.contextmanager
def stand_in(replacements: dict):
    """Within the block every launch of each named kernel calls its stand-in (an object `kernel[grid](...)` accepts):
    the host's cost of a call without the GPU's work, a launch log in a test. Restored on exit, errors included."""
    saved = []
    try:
        for name, fake in replacements.items():
            module = _module(name)
            saved.append((module, entry(name).attr, getattr(module, entry(name).attr)))
            setattr(module, entry(name).attr, fake)
        yield
    finally:
        for module, attr, original in reversed(saved):
            setattr(module, attr, original)
