"""The route of one power-attention call, decided once. `make_plan` turns what a call is (t, p, head dim d, dtype,
device, state in / out, chunk_size, torch.compile) into a frozen `Plan`: the form (attention, chunked or the PyTorch
reference), the chunked form's state-kernel family (the p=2 kernels of chunk_p2/ or the generic ones of chunk.py), the
launcher (eager autograd.Function or torch.library custom ops) and the chunk length. The entry point makes the plan;
dispatch, autograd and chunk.py take its fields and ask nothing again. The numbers behind the choices are
config.dispatch's (the crossings measured in docs/kernels.md); `launches()` shows what the plan launches (kernel and
tile per stage), from the same lookups the launches make.

    >>> print(make_plan(65536, 2, 64, torch.bfloat16))        # also: python -m longctx.kernels.plan t=65536 p=2 d=64

`LONGCTX_POWER_IMPL=auto|chunked|attention|reference` (read once per call, here) overrides the form of a stateless
call: `chunked` at every t for p <= 2 (A/B timing), `attention` always, `reference` the PyTorch reference on CUDA
tensors (a debugging aid, slow and memory-hungry).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Optional

import torch

from . import config, tunables
from .chunk_p2 import config as p2_config

FORMS = ("attention", "chunked", "reference")
FAMILIES = ("p2", "generic")
LAUNCHERS = ("function", "custom_op", "reference")
IMPL_ENV = "LONGCTX_POWER_IMPL"
IMPLS = ("auto", "chunked", "attention", "reference")
TILE2 = p2_config.TILE2
CUDA_HEAD_DIMS = (32, 64, 128)   # the head dims power_attention takes on CUDA (interface.check_inputs)
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64}


def impl() -> str:
    """LONGCTX_POWER_IMPL, checked."""
    value = os.environ.get(IMPL_ENV, "auto")
    if value not in IMPLS:
        raise ValueError(f"{IMPL_ENV}={value!r}: expected one of {IMPLS}")
    return value


def p2_family(p: int, d: int, dtype) -> bool:
    """Whether a chunked p=2 call runs the p=2 state kernels (chunk_p2/): config enabled; bf16, or any dtype with config
    force (the interpreter tests run them in fp32); head dims of whole tiles. The one place that decides it
    (not_p2_family says why not)."""
    return not not_p2_family(p, d, dtype)


def not_p2_family(p: int, d: int, dtype) -> str:
    """Why a chunked call does not run the p=2 state kernels, in words; "" where it does (p2_family)."""
    cfg = p2_config.current()
    if p != 2:
        return f"p={p}: the p=2 state kernels serve p=2 only"
    if not cfg.enabled:
        return "the p=2 state kernels are switched off (chunk_p2 config enabled=False)"
    if d % TILE2:
        return f"d={d} is not a multiple of {TILE2}: the p=2 state kernels take head dims of whole {TILE2}-wide tiles"
    if dtype is None or not (cfg.force or dtype == torch.bfloat16):
        return f"dtype={_name(dtype)}: the p=2 state kernels run bf16 inputs only"
    return ""


def _name(dtype) -> str:
    return {v: k for k, v in _DTYPES.items()}.get(dtype, str(dtype))


def min_chunked_t(p: int, d: int, aligned: bool = False) -> int:
    """Shortest t at which a stateless CUDA call takes the chunked form; aligned: for a t that is a multiple of the
    chunk, where p=2 at d <= 64 (measured there only) takes it from chunked_min_t_aligned (no zero-padded tail). To
    keep the attention form longer, raise both thresholds."""
    return _min_chunked_t(p, d, aligned)[0]


def _min_chunked_t(p: int, d: int, aligned: bool) -> tuple[int, str]:
    """(min_chunked_t, the config.dispatch field it comes from)."""
    cfg = config.dispatch.current()
    if p == 1:
        return cfg.chunked_min_t_linear, "chunked_min_t_linear"
    if p == 2 and d >= 128:
        return cfg.chunked_min_t_wide, "chunked_min_t_wide"
    if aligned and p == 2 and d <= 64 and cfg.chunked_min_t_aligned < cfg.chunked_min_t:
        return cfg.chunked_min_t_aligned, "chunked_min_t_aligned"
    return cfg.chunked_min_t, "chunked_min_t"


def rounds_carried_state(t: int, p: int, d: int, dtype, state_in: bool, state_out: bool) -> bool:
    """Whether the p=2 family would round to bf16 (state_dtype) a state carried over fewer tokens than a chunk (a
    decoding step, a short continuation): such calls take the generic family, whose states are fp32. A state carried
    through many short calls would be rounded once a call and drift: after 256 eager bf16 decoding steps a Llama
    model's logits were 3.96e-2 from float64 ones on an H100, the static decoder's (fp32 state) 1.40e-2. A piece a
    chunk long or more is rounded once per chunk's worth of tokens and keeps the faster family."""
    return state_dtype("p2", dtype) != torch.float32 and (state_in or state_out) and t < default_chunk(p, d, dtype)


def default_chunk(p: int, d: int, dtype=None) -> int:
    """The chunk length of every CUDA call that gives none (stateless or with a state): config.dispatch's chunk_p2 for
    the p=2 family at d <= 64, else its default_chunk."""
    cfg = config.dispatch.current()
    if d <= 64 and p2_family(p, d, dtype):
        return cfg.chunk_p2
    return cfg.default_chunk


def cuda_chunk_size(t: int, p: int, d: int, dtype=None, impl_: Optional[str] = None) -> Optional[int]:
    """Chunk length of a stateless CUDA call with chunk_size=None, or None for the attention form: the chunked form
    where it is the faster one, t >= min_chunked_t (from a shorter t where t is whole chunks) and either p = 1 (a d x d
    state: cheap at any dtype) or the p=2 family (bf16); else the attention form (fastest at short t; the faster form
    for p >= 3 and for p = 2 in fp16 / fp32, where only the generic chunked kernels exist). impl_: LONGCTX_POWER_IMPL
    (None: read it)."""
    impl_ = impl() if impl_ is None else impl_
    if impl_ in ("attention", "reference"):
        return None
    if impl_ == "chunked" and p <= 2:
        return default_chunk(p, d, dtype)
    if not (p == 1 or p2_family(p, d, dtype)):
        return None
    chunk = default_chunk(p, d, dtype)
    return chunk if t >= min_chunked_t(p, d, aligned=t % chunk == 0) else None


def cpu_chunk_size(t: int, p: int) -> Optional[int]:
    """The CPU reference's chunk for a call with chunk_size=None: quadratic for short t and for p >= 3 (states of
    D = 45k+ at d=64), else 256."""
    return None if p >= 3 or t <= 1024 else 256


def state_dtype(family: str, dtype) -> torch.dtype:
    """The dtype of the per-chunk states a chunked forward saves: bf16 where the p=2 family runs on bf16 inputs (bf16
    matmul operands anyway; sums stay fp32 in registers), else fp32."""
    return torch.bfloat16 if family == "p2" and dtype == torch.bfloat16 else torch.float32


@dataclasses.dataclass(frozen=True)
class Plan:
    """The route of one call: what it is (t .. compiling) and what runs it (form .. chunk; launches())."""
    t: int
    p: int
    d: int
    dtype: torch.dtype
    device: str                 # "cuda" or "cpu"
    norm: bool
    state_in: bool
    state_out: bool
    compiling: bool
    form: str                   # FORMS
    family: str                 # the chunked form's state kernels (FAMILIES); "" for the other forms
    launcher: str               # LAUNCHERS: custom ops under torch.compile (stateless), else autograd.Functions
    chunk: Optional[int]        # the chunk the chunked form runs (at most t) or the reference's; None: quadratic

    def launches(self) -> dict:
        """{stage: (kernel, tile entry or None)} of what this plan launches, from the lookups the launches make (tiles
        as (BM, BN, warps, stages[, maxnreg]), the p=2 kernels' (JG, rows, ...), a Gluon row kernel's (rows, warps,
        ring slots)). The p=2 family runs its Gluon kernels on CUDA with bf16 and a Triton that has Gluon, their
        Triton versions elsewhere (the interpreter, fp32 under force)."""
        return {stage: (kernel, tile) for stage, (kernel, _, tile) in self._stages().items()}

    def table_keys(self) -> dict:
        """{stage: the tunables table's key its tile is read from (tunables.TABLE)}; a runtime override (config
        block_override, a P2Config tile field) replaces the row's entry in launches()."""
        return {stage: key for stage, (_, key, _) in self._stages().items() if key is not None}

    def _stages(self) -> dict:
        """{stage: (kernel, tunables key or None, tile)}: launches() and table_keys()."""
        from . import chunk as generic, parallel
        from .chunk_p2 import kernels as p2_kernels
        if self.form == "reference":
            return {"all": ("reference (PyTorch, no kernel)", None, None)}
        chunked = self.form == "chunked"
        out = {}
        for kernel in ("fwd", "dq", "dkdv"):
            dot_dt = parallel.dot_dtype(self.dtype, self.norm, kernel != "fwd")[0]
            t = None if chunked else self.t
            out[("intra_" if chunked else "") + kernel] = ("attn_" + kernel, parallel.tile_key(
                self.d, kernel, dot_dt, chunked, t), parallel.blocks(self.d, kernel, dot_dt, chunked, t))
        if not chunked and parallel.fused_backward():     # one backward kernel, dq by atomics (its tile: dk/dv's)
            adds = "bulk reductions" if parallel.tma_dq(torch.device(self.device)) else "atomics"
            out = {"fwd": out["fwd"], "bwd_prep": ("attn_bwd_prep", None, None),     # launch constants
                   "dkdv": (f"attn_dkdv (+ dq by {adds})", *out["dkdv"][1:]),
                   "dq_finish": ("attn_dq_finish", None, None)}
        if self.family == "generic":
            key = generic.state_tile_key(self.p, self.d, self.dtype)
            tile = tunables.TABLE[key]
            out["states"] = ("chunk_update_fwd + discumsum", key, tile)
            out["query_states"] = ("chunk_query_fwd", key, tile)
            out["state_grads"] = ("chunk_query_grad + discumsum", key, tile)
            out["query_bwd"] = ("chunk_query_bwd", key, tile)
            out["key_bwd"] = ("chunk_update_bwd", key, tile)
        elif self.family == "p2":
            cfg, d, cuda = p2_config.current(), self.d, self.device == "cuda"

            def triton_kernel(name, kernel):
                return name, tunables.key("sym2_" + kernel, d), p2_kernels.block_entry(kernel, d)

            def gluon_rows(name, block):
                return name, tunables.key(name, d, "bf16"), block

            if p2_kernels.gluon_outer_runs(cuda, self.dtype, d, self.chunk):
                outer = ("gluon_outer (scanning)", tunables.key("gluon_outer", d, "bf16"),
                         (*p2_kernels.gluon_outer_block(d, self.chunk), cfg.outer_stages))
            else:
                outer = triton_kernel("sym2_outer + discumsum", "outer")
            rows = p2_kernels.gluon_rows_run(cuda, self.dtype, d)
            out["states"] = out["state_grads"] = outer
            out["query_states"] = (gluon_rows("gluon_query_fwd_rows", cfg.qfwd_block) if rows
                                   else triton_kernel("sym2_qfwd_rows", "qfwd_rows"))
            if not p2_kernels.row_scaled_qbwd(d):
                out["query_bwd"] = triton_kernel("sym2_qbwd", "qbwd")
            else:
                out["query_bwd"] = (gluon_rows("gluon_query_bwd_rows", cfg.qbwd_block) if rows
                                    else triton_kernel("sym2_qbwd_rows", "qbwd_rows"))
            if rows:
                out["key_dk"] = gluon_rows("gluon_key_dk_rows", cfg.kdk_block)
                out["key_dv"] = gluon_rows("gluon_key_dv_rows", cfg.kdv_block)
            else:
                out["key_dk"] = triton_kernel("sym2_kbwd", "kbwd")
                out["key_dv"] = triton_kernel("sym2_kdv_rows", "kdv_rows")
        return out

    def why(self) -> str:
        """Why the call does not take the fast route (the chunked form on the p=2 state kernels), in words; "" where
        it does. Worked out when asked (the printed plan), from the same rules as the route, never per call."""
        t, p, d, dtype = self.t, self.p, self.d, self.dtype
        if self.device == "cuda" and d not in CUDA_HEAD_DIMS:      # power_attention's own check refuses it first
            return (f"d={d} is not a supported CUDA head dim ({', '.join(map(str, CUDA_HEAD_DIMS))}): power_attention "
                    f"refuses CUDA inputs of this d")
        if self.form == "reference":
            return (f"device={self.device}: the PyTorch reference (the kernels run on CUDA tensors)"
                    if self.device != "cuda" else f"{IMPL_ENV}=reference")
        if self.form == "attention":
            impl_ = impl()
            if impl_ == "attention":
                return f"{IMPL_ENV}=attention"
            if self.device != "cuda" or self.state_in or self.state_out or cuda_chunk_size(t, p, d, dtype, impl_):
                return "form=attention asked"
            reason = not_p2_family(p, d, dtype)
            if p != 1 and reason:
                return (f"{reason}; without them the attention form is faster than the generic "
                        f"chunked kernels" + (f" ({IMPL_ENV}=chunked takes them for p <= 2)" if p <= 2 else ""))
            least, field = _min_chunked_t(p, d, aligned=t % default_chunk(p, d, dtype) == 0)
            return f"t={t} is below {least} (config.dispatch {field}), from where the chunked form is the faster"
        if self.family == "generic":
            reason = not_p2_family(p, d, dtype)
            if reason:
                return f"{reason}; the generic chunked kernels run instead"
            return (f"a state carried over t={t} tokens, fewer than a chunk ({default_chunk(p, d, dtype)}): the "
                    f"generic chunked kernels keep it in fp32 (the p=2 state kernels' bf16 states drift call after "
                    f"call)")
        return ""

    def describe(self, rows: bool = False) -> str:
        """str(plan); rows: also the tunables table's rows its launches read (key, then the table's entry)."""
        text = str(self)
        if rows:
            lines = ["tunables (tunables.TABLE)"]
            lines += [f"  {stage:13s} {tunables.describe(key):52s} {tunables.named(key[0], tunables.TABLE[key])}"
                      for stage, key in self.table_keys().items()]
            text += "\n" + "\n".join(lines)
        return text

    def __str__(self) -> str:
        name = _name(self.dtype)
        why = self.why()
        state = "+".join(x for x, on in (("in", self.state_in), ("out", self.state_out)) if on) or "none"
        lines = [f"call     t={self.t} p={self.p} d={self.d} dtype={name} device={self.device} norm={self.norm} "
                 f"state={state} compiling={self.compiling}",
                 f"form     {self.form}" + (f" ({self.family} state kernels)" if self.family else ""),
                 *([f"why      {why}"] if why else []),
                 f"launcher {self.launcher}",
                 f"chunk    {self.chunk}"]
        if self.family:
            lines.append(f"states   {_name(state_dtype(self.family, self.dtype))}, one per chunk")
        for stage, (kernel, key, tile) in self._stages().items():     # tiles with their places' names
            shown = "" if tile is None else tunables.named(key[0] if key else "", tile)
            lines.append(f"  {stage:13s} {kernel:52s} {shown}".rstrip())
        return "\n".join(lines)


def make_plan(t: int, p: int, d: int, dtype, device: str = "cuda", *, chunk_size: Optional[int] = None,
              norm: bool = True, state_in: bool = False, state_out: bool = False, compiling: Optional[bool] = None,
              form: Optional[str] = None) -> Plan:
    """The plan of a call on (b, t, h, d) inputs of `dtype` on `device` ("cuda" or "cpu"). chunk_size: the caller's
    (None: the default for the shape). state_in / state_out: initial_state given / return_state. compiling: under
    torch.compile (None: ask torch). form: "attention" or "chunked" forces that form on any device (the form
    functions called directly, the interpreter tests); None routes as power_attention does:

    * CPU tensors (or LONGCTX_POWER_IMPL=reference): the reference, chunked with chunk_size or cpu_chunk_size;
    * CUDA, stateless, chunk_size=None: the form cuda_chunk_size picks;
    * CUDA with chunk_size, initial_state or return_state: the chunked form, chunk default_chunk where none is given;
      the p=2 family where p2_family says so, but for a bf16 call carrying a state over fewer tokens than a chunk
      (rounds_carried_state: the generic family's fp32 states).

    Example:
        >>> make_plan(65536, 2, 64, torch.bfloat16).chunk
        512
    """
    device = torch.device(device).type
    if compiling is None:
        compiling = torch.compiler.is_compiling()
    stateless = not state_in and not state_out
    chunk = chunk_size
    if form is None:
        if device != "cuda":
            form, chunk = "reference", chunk if chunk is not None else cpu_chunk_size(t, p)
        else:
            impl_ = impl()
            if chunk is None:
                chunk = cuda_chunk_size(t, p, d, dtype, impl_)
            form = ("reference" if impl_ == "reference" else "attention" if chunk is None and stateless
                    else "chunked")
    elif form not in ("attention", "chunked"):
        raise ValueError(f"form={form!r}: expected 'attention', 'chunked' or None")
    family, launcher = "", "reference"
    if form == "attention":
        chunk, launcher = None, "custom_op" if compiling else "function"
    elif form == "chunked":
        chunk = min(int(chunk or default_chunk(p, d, dtype)), t)
        family = "p2" if p2_family(p, d, dtype) and not rounds_carried_state(t, p, d, dtype, state_in, state_out) \
            else "generic"
        # dynamo cannot trace the launches: a stateless call under torch.compile is one opaque op per pass
        launcher = "custom_op" if compiling and stateless else "function"
    return Plan(t=t, p=p, d=d, dtype=dtype, device=device, norm=norm, state_in=state_in, state_out=state_out,
                compiling=bool(compiling), form=form, family=family, launcher=launcher, chunk=chunk)


def parse_args(argv) -> dict:
    """make_plan's keyword arguments from 'NAME=VALUE' items: t, p, d (ints), dtype (bf16, fp16, fp32), device,
    chunk_size, norm / state_in / state_out / compiling (0 or 1), form. Defaults: p=2, d=64, bf16 on cuda."""
    out = dict(p=2, d=64, dtype=torch.bfloat16, device="cuda")
    for item in argv:
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"{item!r}: expected NAME=VALUE")
        if name in ("t", "p", "d", "chunk_size"):
            low, high = (1, 4) if name == "p" else (1, None)   # p: the degrees the kernels and models take
            try:
                out[name] = int(value)
            except ValueError:
                out[name] = None
            if out[name] is None or out[name] < low or (high is not None and out[name] > high):
                want = f"an integer in {low}..{high}" if high else "a positive integer"
                raise ValueError(f"{name}={value!r}: expected {want}")
        elif name == "dtype":
            if value not in _DTYPES:
                raise ValueError(f"dtype={value!r}: expected one of {sorted(_DTYPES)}")
            out[name] = _DTYPES[value]
        elif name in ("norm", "state_in", "state_out", "compiling"):
            if value not in ("0", "1"):
                raise ValueError(f"{name}={value!r}: expected 0 or 1")
            out[name] = value == "1"
        elif name in ("device", "form"):
            out[name] = value
        else:
            hint = f"; the context length is t (t={value})" if name in ("ctx", "T", "seq_len", "seqlen") else ""
            raise ValueError(f"{item!r}: no argument {name!r} (t, p, d, dtype, device, chunk_size, norm, state_in, "
                             f"state_out, compiling, form){hint}")
    if "t" not in out:
        raise ValueError("t=... is required")
    return out


def plan_of(argv) -> Plan:
    """make_plan of command-line items (parse_args)."""
    kw = parse_args(argv)
    return make_plan(kw.pop("t"), kw.pop("p"), kw.pop("d"), kw.pop("dtype"), kw.pop("device"), **kw)
